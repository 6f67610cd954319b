package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeEdge is a region's storefront edge as far as a buyer sees it: by buyer number, some
// are queued first, some throttled once, some told SOLD_OUT or BOUND_ELSEWHERE, the rest
// admitted; a reservation needs the ticket, and the request key checkout-1.
type fakeEdge struct {
	t         *testing.T
	mu        sync.Mutex
	addrs     map[string]string // X-Client-Address → user
	throttled map[string]bool
	polls     map[string]int
	protos    map[string]int
}

func newFakeEdge(t *testing.T) *fakeEdge {
	return &fakeEdge{t: t, addrs: map[string]string{}, throttled: map[string]bool{}, polls: map[string]int{}, protos: map[string]int{}}
}

func writeAnswer(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		panic(err)
	}
}

func writeErr(w http.ResponseWriter, code int, reason string, retryMs int64) {
	if retryMs > 0 {
		w.Header().Set("Retry-After", "1")
	}
	writeAnswer(w, code, map[string]any{"error": map[string]any{"code": reason, "message": "fake " + reason, "retry_after_ms": retryMs, "region": "eu"}})
}

func buyerNumber(user string) int {
	n, err := strconv.Atoi(user[strings.LastIndex(user, "-")+1:])
	if err != nil {
		panic(user)
	}
	return n
}

func (f *fakeEdge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.protos[r.Proto]++
	f.mu.Unlock()
	switch {
	case r.URL.Path == "/v1/ping":
		writeAnswer(w, 200, struct{}{})
	case r.Method == "POST" && r.URL.Path == "/v1/sales/s1/admissions":
		f.enter(w, r)
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/sales/s1/admissions/"):
		user := strings.TrimPrefix(r.URL.Path, "/v1/sales/s1/admissions/")
		f.mu.Lock()
		f.polls[user]++
		second := f.polls[user] > 1
		f.mu.Unlock()
		if !second {
			writeAnswer(w, 200, map[string]any{"admission_id": user, "state": "queued", "retry_after_ms": 5})
			return
		}
		writeAnswer(w, 200, map[string]any{"admission_id": user, "state": "admitted", "ticket": "t." + user})
	case r.Method == "POST" && r.URL.Path == "/v1/sales/s1/reservations":
		var body struct {
			Ticket     string `json:"ticket"`
			SKU        string `json:"sku"`
			Quantity   int64  `json:"quantity"`
			RequestKey string `json:"request_key"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !strings.HasPrefix(body.Ticket, "t.") || body.RequestKey != "checkout-1" {
			writeErr(w, 400, "INVALID_ARGUMENT", 0)
			return
		}
		user := strings.TrimPrefix(body.Ticket, "t.")
		writeAnswer(w, 201, map[string]any{"hold_id": "us." + user, "quantity": body.Quantity, "state": "held"})
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/confirm"):
		writeAnswer(w, 200, map[string]any{"outcome": "sold"})
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/release"):
		writeAnswer(w, 200, map[string]any{"state": "released"})
	default:
		writeErr(w, 404, "NOT_FOUND", 0)
	}
}

func (f *fakeEdge) enter(w http.ResponseWriter, r *http.Request) {
	var body struct {
		User string `json:"user_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.User == "" {
		writeErr(w, 400, "INVALID_ARGUMENT", 0)
		return
	}
	addr := r.Header.Get("X-Client-Address")
	n := buyerNumber(body.User)
	f.mu.Lock()
	if u, ok := f.addrs[addr]; ok && u != body.User || addr == "" {
		f.t.Errorf("buyer %s came from address %q, which %s used", body.User, addr, u)
	}
	f.addrs[addr] = body.User
	throttle := n%5 == 0 && !f.throttled[body.User]
	f.throttled[body.User] = true
	f.mu.Unlock()
	switch {
	case throttle:
		writeErr(w, 429, "OVERLOADED", 5)
	case n%7 == 0:
		writeErr(w, 409, "SOLD_OUT", 0)
	case n%11 == 0:
		writeErr(w, 409, "BOUND_ELSEWHERE", 0)
	case n%2 == 0:
		writeAnswer(w, 202, map[string]any{"admission_id": body.User, "state": "queued", "retry_after_ms": 5})
	default:
		writeAnswer(w, 201, map[string]any{"admission_id": body.User, "state": "admitted", "ticket": "t." + body.User})
	}
}

// TestHTTPModeFollowsTheWaitingRoom: buyers enter, wait out a 429, poll a queued admission,
// reserve with their ticket and settle their hold, each from its own address; SOLD_OUT and
// BOUND_ELSEWHERE are counted, nothing fails, and the calls go over HTTP/2.
func TestHTTPModeFollowsTheWaitingRoom(t *testing.T) {
	f := newFakeEdge(t)
	srv := httptest.NewUnstartedServer(f)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	const buyers = 200
	s, err := Run(context.Background(), Config{Sale: "s1", SKU: "phone", Regions: []Region{{Name: "us", Weight: 1}},
		HTTP: &HTTPEdge{Client: srv.Client(), Bases: map[string]string{"us": srv.URL}}, Buyers: buyers, Concurrency: 16,
		ConfirmRatio: 0.5, ReleaseRatio: 0.2, UserPrefix: "p-", MaxDuration: 30 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var soldOut, bound, queued, throttled int64
	for n := range buyers {
		switch {
		case n%7 == 0:
			soldOut++
		case n%11 == 0:
			bound++
		case n%2 == 0:
			queued++
		}
		if n%5 == 0 {
			throttled++
		}
	}
	granted := buyers - soldOut - bound
	if s.Buyers != buyers || s.SoldOut != soldOut || s.Bound != bound || s.Admitted != granted || s.Granted != granted ||
		s.Throttled != throttled || s.Polls != 2*queued || s.Failed != 0 {
		t.Errorf("stats %+v; want %d buyers, %d sold out, %d bound elsewhere, %d admitted and granted, %d throttled, %d polls, none failed",
			s, buyers, soldOut, bound, granted, throttled, 2*queued)
	}
	if s.Confirmed+s.Released+s.Abandoned != granted || s.Confirmed == 0 || s.Released == 0 || s.Abandoned == 0 {
		t.Errorf("holds: %d paid, %d released, %d abandoned of %d", s.Confirmed, s.Released, s.Abandoned, granted)
	}
	if len(f.addrs) != buyers {
		t.Errorf("%d distinct client addresses for %d buyers", len(f.addrs), buyers)
	}
	if f.protos["HTTP/2.0"] == 0 || len(f.protos) != 1 {
		t.Errorf("protocols used: %v; want HTTP/2 only", f.protos)
	}
}

// TestHTTPModeSettings: HTTP mode needs a client and a URL per region, not gRPC credentials;
// an edge that does not answer fails the run before any buyer.
func TestHTTPModeSettings(t *testing.T) {
	regions := []Region{{Name: "us", Weight: 1}, {Name: "eu", Weight: 1}}
	for _, h := range []*HTTPEdge{{Bases: map[string]string{"us": "https://a", "eu": "https://b"}},
		{Client: http.DefaultClient, Bases: map[string]string{"us": "https://a"}}} {
		cfg := Config{Sale: "s", SKU: "k", Regions: regions, HTTP: h, Buyers: 1, Concurrency: 1}
		if err := cfg.Validate(); err == nil {
			t.Errorf("%+v: valid; want an error", h)
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeErr(w, 403, "PERMISSION_DENIED", 0) }))
	defer srv.Close()
	cfg := Config{Sale: "s", SKU: "k", Regions: regions, Buyers: 1, Concurrency: 1,
		HTTP: &HTTPEdge{Client: srv.Client(), Bases: map[string]string{"us": srv.URL, "eu": srv.URL}}}
	s, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrEdgeUnreachable) || !strings.Contains(err.Error(), "PERMISSION_DENIED") || s.Buyers != 0 {
		t.Errorf("run against an edge refusing the ping: %v, %d buyers; want ErrEdgeUnreachable naming PERMISSION_DENIED", err, s.Buyers)
	}
	if got := fmt.Sprint(syntheticAddress(0), " ", syntheticAddress(70000)); got != "10.0.0.0 10.1.17.112" {
		t.Errorf("synthetic addresses %s", got)
	}
}

// fakeWaitlist is a sold-out sale's edge: the waiting room answers SOLD_OUT; a buyer's first
// waitlist join is CONFLICT (units came back, so not drained), the next queues them; polls
// offer the units left, one each, and once none is left the page says sold out.
type fakeWaitlist struct {
	mu      sync.Mutex
	units   int
	joined  map[string]int
	forGood bool // the page says sold out once the units are gone
}

func (f *fakeWaitlist) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.URL.Path == "/v1/ping":
		writeAnswer(w, 200, struct{}{})
	case r.Method == "GET" && r.URL.Path == "/v1/sales/s2":
		writeAnswer(w, 200, map[string]any{"skus": []map[string]any{{"sku": "phone", "sold_out": f.forGood && f.units == 0}}})
	case r.Method == "POST" && r.URL.Path == "/v1/sales/s2/admissions":
		writeErr(w, 409, "SOLD_OUT", 0)
	case r.Method == "POST" && r.URL.Path == "/v1/sales/s2/waitlist":
		var body struct {
			User string `json:"user_id"`
			SKU  string `json:"sku"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.SKU != "phone" || body.User == "" {
			writeErr(w, 400, "INVALID_ARGUMENT", 0)
			return
		}
		if f.joined[body.User]++; f.joined[body.User] == 1 {
			writeErr(w, 409, "CONFLICT", 0)
			return
		}
		writeAnswer(w, 202, map[string]any{"admission_id": body.User, "state": "queued", "retry_after_ms": 5})
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/sales/s2/admissions/"):
		user := strings.TrimPrefix(r.URL.Path, "/v1/sales/s2/admissions/")
		if f.units == 0 {
			writeAnswer(w, 200, map[string]any{"admission_id": user, "state": "queued", "retry_after_ms": 5})
			return
		}
		f.units--
		writeAnswer(w, 200, map[string]any{"admission_id": user, "state": "admitted", "ticket": "t." + user, "sku": "phone"})
	case r.Method == "POST" && r.URL.Path == "/v1/sales/s2/reservations":
		var body struct {
			Ticket string `json:"ticket"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			writeErr(w, 400, "INVALID_ARGUMENT", 0)
			return
		}
		writeAnswer(w, 201, map[string]any{"hold_id": "us." + body.Ticket, "quantity": 1, "state": "held"})
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/confirm"):
		writeAnswer(w, 200, map[string]any{"outcome": "sold"})
	default:
		writeErr(w, 404, "NOT_FOUND", 0)
	}
}

// TestHTTPModeWaitlist: buyers told SOLD_OUT join the waitlist (entering the room again
// when it answers CONFLICT), take the offers there are, and stop when the page says sold
// out for good, or when their wait ends.
func TestHTTPModeWaitlist(t *testing.T) {
	for _, tc := range []struct {
		forGood            bool
		wait               time.Duration
		soldOut, waitedOut int64
	}{{true, 20 * time.Second, 7, 0}, {false, 3 * time.Second, 0, 7}} {
		f := &fakeWaitlist{units: 3, joined: map[string]int{}, forGood: tc.forGood}
		srv := httptest.NewServer(f)
		s, err := Run(context.Background(), Config{Sale: "s2", SKU: "phone", Regions: []Region{{Name: "us", Weight: 1}},
			HTTP:   &HTTPEdge{Client: srv.Client(), Bases: map[string]string{"us": srv.URL}, Waitlist: tc.wait},
			Buyers: 10, Concurrency: 10, ConfirmRatio: 1, UserPrefix: "w-", MaxDuration: 30 * time.Second})
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if s.Waitlisted != 10 || s.Offered != 3 || s.Granted != 3 || s.Confirmed != 3 || s.SoldOut != tc.soldOut ||
			s.WaitedOut != tc.waitedOut || s.Failed != 0 {
			t.Errorf("sold out for good %v, wait %s: %+v; want 10 waitlisted, 3 offered, granted and paid, %d sold out, %d waited out",
				tc.forGood, tc.wait, s, tc.soldOut, tc.waitedOut)
		}
	}
}

// TestHTTPModeSpreadsBuyersOverARegionsEdges: with two edges of us (Bases and More), every
// buyer goes through one of them and stays there, and each edge serves about half of them.
func TestHTTPModeSpreadsBuyersOverARegionsEdges(t *testing.T) {
	var fakes [2]*fakeEdge
	var urls [2]string
	var client *http.Client
	for i := range fakes {
		fakes[i] = newFakeEdge(t)
		srv := httptest.NewUnstartedServer(fakes[i])
		srv.EnableHTTP2 = true
		srv.StartTLS()
		defer srv.Close()
		urls[i] = srv.URL
		if client == nil {
			client = srv.Client() // both servers use httptest's one certificate
		}
	}
	const buyers = 200
	s, err := Run(context.Background(), Config{Sale: "s1", SKU: "phone", Regions: []Region{{Name: "us", Weight: 1}},
		HTTP:   &HTTPEdge{Client: client, Bases: map[string]string{"us": urls[0]}, More: map[string][]string{"us": {urls[1]}}},
		Buyers: buyers, Concurrency: 16, ConfirmRatio: 0.5, UserPrefix: "p-", MaxDuration: 30 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s.Buyers != buyers || s.Failed != 0 {
		t.Fatalf("stats %+v; want %d buyers, none failed", s, buyers)
	}
	a, b := len(fakes[0].addrs), len(fakes[1].addrs)
	if a+b != buyers || a != buyers/2 || b != buyers/2 {
		t.Errorf("buyers seen by the two edges: %d and %d; want each buyer at one edge only, %d at each", a, b, buyers/2)
	}
}
