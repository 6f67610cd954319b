package cluster_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// httpClient is a storefront's HTTP client presenting role's certificate ("" for none).
func httpClient(t testing.TB, role trust.Role) *http.Client {
	t.Helper()
	var cfg *tls.Config
	var err error
	if role == "" {
		cfg, err = certs.ClientConfig(trust.Storefront)
		if err == nil {
			cfg.Certificates = nil
		}
	} else {
		cfg, err = certs.ClientConfig(role)
	}
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// answer is one HTTP answer, its JSON decoded loosely.
type answer struct {
	code   int
	header http.Header
	body   map[string]any
}

func (a answer) str(k string) string { s, _ := a.body[k].(string); return s }

func (a answer) errCode() string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (a answer) errField(k string) string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e[k].(string)
	return s
}

func call(t testing.TB, c *http.Client, method, url string, body any) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{code: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			t.Fatalf("%s %s: %d, not JSON: %q", method, url, resp.StatusCode, raw)
		}
	}
	return a
}

// createWaitingSale creates a sale with a waiting room and splits it over the regions.
func createWaitingSale(t *testing.T, d *cluster.Dev, sale string, total, rate int64, weights map[string]int64) {
	t.Helper()
	createWaitingSaleHolding(t, d, sale, total, rate, weights, time.Minute)
}

// createWaitingSaleHolding is createWaitingSale with holds lasting holdTTL.
func createWaitingSaleHolding(t *testing.T, d *cluster.Dev, sale string, total, rate int64, weights map[string]int64, holdTTL time.Duration) {
	t.Helper()
	ctx := context.Background()
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: total}},
		PerUserLimit: 2, HoldTtlMs: holdTTL.Milliseconds(), AdmitRate: rate, TicketTtlMs: 30000}); err != nil {
		t.Fatal(err)
	}
	areq := &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale}
	for r, w := range weights {
		areq.Weights = append(areq.Weights, &quotav1.RegionWeight{Region: r, Weight: w})
	}
	if _, err := coord.Allocate(ctx, areq); err != nil {
		t.Fatal(err)
	}
}

func edgeURL(d *cluster.Dev, region string) string {
	for _, n := range d.Regions {
		if n.R.Name() == region {
			return "https://" + n.HTTPAddr()
		}
	}
	panic("no region " + region)
}

// admit enters user at base and polls until the admission has a ticket.
func admit(t testing.TB, c *http.Client, base, sale, user string) answer {
	t.Helper()
	a := call(t, c, "POST", base+"/v1/sales/"+sale+"/admissions", map[string]string{"user_id": user})
	deadline := time.Now().Add(20 * time.Second)
	for a.code == http.StatusAccepted && time.Now().Before(deadline) {
		if a.header.Get("Retry-After") == "" || a.str("admission_id") == "" {
			t.Fatalf("a queued answer without Retry-After or an id: %v %v", a.header, a.body)
		}
		time.Sleep(20 * time.Millisecond)
		a = call(t, c, "GET", base+"/v1/sales/"+sale+"/admissions/"+a.str("admission_id"), nil)
	}
	return a
}

// admitBound is admit for a buyer bound to another region: a waiting room that has not
// heard their binding within its wait admits them and withdraws the admission when the
// binding answers (region/doorbind.go), so it polls through an admission, 10 s at most.
func admitBound(t testing.TB, c *http.Client, base, sale, user string) answer {
	t.Helper()
	a := admit(t, c, base, sale, user)
	for deadline := time.Now().Add(10 * time.Second); a.code == http.StatusOK && a.str("admission_id") != "" && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		a = call(t, c, "GET", base+"/v1/sales/"+sale+"/admissions/"+a.str("admission_id"), nil)
	}
	return a
}

// TestStorefrontHTTPFlow walks a buyer through the HTTP edge: the sale's page, the waiting
// room, a ticket, a reservation and its replay, the ticket's one use, the binding to one
// region, and the payment; and checks the refusals each carry their code.
func TestStorefrontHTTPFlow(t *testing.T) {
	d := startDev(t, "us", "eu")
	createWaitingSale(t, d, "drop", 10, 100, map[string]int64{"us": 1, "eu": 1})
	c := httpClient(t, trust.Storefront)
	us, eu := edgeURL(d, "us"), edgeURL(d, "eu")

	page := call(t, c, "GET", us+"/v1/sales/drop", nil)
	if page.code != 200 || page.header.Get("ETag") == "" || !strings.Contains(page.header.Get("Cache-Control"), "max-age=1") {
		t.Fatalf("sale page: %d %v %v", page.code, page.header, page.body)
	}
	req, _ := http.NewRequest("GET", us+"/v1/sales/drop", nil)
	req.Header.Set("If-None-Match", page.header.Get("ETag"))
	if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusNotModified {
		t.Fatalf("If-None-Match: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	a := admit(t, c, us, "drop", "alice")
	if a.code != http.StatusOK && a.code != http.StatusCreated || a.str("ticket") == "" || a.str("state") != "admitted" {
		t.Fatalf("admission: %d %v", a.code, a.body)
	}
	again := call(t, c, "POST", us+"/v1/sales/drop/admissions", map[string]string{"user_id": "alice"})
	if again.str("admission_id") != a.str("admission_id") {
		t.Fatalf("entering again gave another admission: %v, then %v", a.body, again.body)
	}
	ticket := a.str("ticket")
	res := call(t, c, "POST", us+"/v1/sales/drop/reservations", map[string]any{"ticket": ticket, "sku": "phone", "quantity": 2, "request_key": "k1"})
	if res.code != http.StatusCreated || res.str("state") != "held" || res.str("admission_id") != a.str("admission_id") {
		t.Fatalf("reserve: %d %v", res.code, res.body)
	}
	if rep := call(t, c, "POST", us+"/v1/sales/drop/reservations", map[string]any{"ticket": ticket, "sku": "phone", "quantity": 2, "request_key": "k1"}); rep.code != 200 || rep.str("hold_id") != res.str("hold_id") {
		t.Fatalf("replay: %d %v", rep.code, rep.body)
	}
	refusals := []struct {
		name, url string
		body      map[string]any
		code      int
		reason    string
	}{
		{"another key", us, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 1, "request_key": "k2"}, 409, "TICKET_USED"},
		{"tampered", us, map[string]any{"ticket": ticket[:len(ticket)-2] + "AA", "sku": "phone", "quantity": 1, "request_key": "k3"}, 401, "TICKET_INVALID"},
		{"another region", eu, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 1, "request_key": "k4"}, 401, "TICKET_INVALID"},
		{"no ticket", us, map[string]any{"sku": "phone", "quantity": 1, "request_key": "k5"}, 400, "INVALID_ARGUMENT"},
		{"bad quantity", us, map[string]any{"ticket": ticket, "sku": "phone", "quantity": "two", "request_key": "k6"}, 400, "INVALID_ARGUMENT"},
	}
	dbs := regionDBs(t, d, "us", "eu")
	before := map[string]map[string]string{"us": regionState(t, dbs["us"]), "eu": regionState(t, dbs["eu"])}
	for _, r := range refusals {
		got := call(t, c, "POST", r.url+"/v1/sales/drop/reservations", r.body)
		if got.code != r.code || got.errCode() != r.reason || got.errField("message") == "" {
			t.Errorf("%s: %d %v, want %d %s", r.name, got.code, got.body, r.code, r.reason)
		}
	}
	// Nothing was written: each region's pools (available, held, sold) and its holds are as before.
	for _, name := range []string{"us", "eu"} {
		after := regionState(t, dbs[name])
		for _, table := range []string{"pools", "holds"} {
			if after[table] != before[name][table] {
				t.Errorf("%s's %s after the refusals: %q, want %q as before", name, table, after[table], before[name][table])
			}
		}
	}

	// The buyer is bound to us: eu's waiting room sends them back there.
	b := admitBound(t, c, eu, "drop", "alice")
	if b.code != http.StatusConflict || b.errCode() != "BOUND_ELSEWHERE" || b.errField("region") != "us" {
		t.Fatalf("alice at eu: %d %v", b.code, b.body)
	}

	hold := res.str("hold_id")
	conf := call(t, c, "POST", us+"/v1/holds/"+hold+"/confirm", map[string]string{"payment_id": "pay-1"})
	if conf.code != 200 || conf.str("outcome") != "sold" {
		t.Fatalf("confirm: %d %v", conf.code, conf.body)
	}
	if g := call(t, c, "GET", us+"/v1/holds/"+hold, nil); g.str("state") != "sold" {
		t.Fatalf("hold: %d %v", g.code, g.body)
	}
	if nf := call(t, c, "GET", us+"/v1/nowhere", nil); nf.code != 404 || nf.errCode() != "NOT_FOUND" {
		t.Fatalf("unknown route: %d %v", nf.code, nf.body)
	}
	if bad := call(t, c, "POST", us+"/v1/sales/drop/admissions", map[string]string{"user": "x"}); bad.code != 400 || bad.errField("field") != "body" {
		t.Fatalf("unknown field: %d %v", bad.code, bad.body)
	}
}

// regionDBs are connections to the named regions' databases, closed when t ends.
func regionDBs(t *testing.T, d *cluster.Dev, names ...string) map[string]*pgxpool.Pool {
	t.Helper()
	dbs := map[string]*pgxpool.Pool{}
	for _, name := range names {
		db, err := pgutil.Open(context.Background(), d.DBURLs[name], 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		dbs[name] = db
	}
	return dbs
}

// TestStorefrontHTTPRoles: the HTTP edge is authorized by the same table as gRPC.
func TestStorefrontHTTPRoles(t *testing.T) {
	d := startDev(t, "us")
	createWaitingSale(t, d, "drop", 10, 100, map[string]int64{"us": 1})
	us := edgeURL(d, "us")
	for _, tc := range []struct {
		role   trust.Role
		method string
		path   string
		code   int
	}{
		{"", "GET", "/v1/sales/drop", 401},
		{trust.Operator, "POST", "/v1/sales/drop/admissions", 403},
		{trust.Coordinator, "GET", "/v1/sales/drop", 403},
		{trust.Operator, "GET", "/v1/sales/drop", 200},
		{trust.Storefront, "GET", "/v1/sales/drop", 200},
	} {
		var body any
		if tc.method == "POST" {
			body = map[string]string{"user_id": "bob"}
		}
		got := call(t, httpClient(t, tc.role), tc.method, us+tc.path, body)
		if got.code != tc.code {
			t.Errorf("%q %s %s: %d %v, want %d", tc.role, tc.method, tc.path, got.code, got.body, tc.code)
		}
	}

}

// TestAdmissionsAreRateLimited: one buyer knocking again and again, or one address sending
// many buyers, is answered 429 OVERLOADED with Retry-After; others are not held up. The
// X-Client-Address header counts only from the storefront role.
func TestAdmissionsAreRateLimited(t *testing.T) {
	d := startDev(t, "us")
	createWaitingSale(t, d, "bots", 100, 1000, map[string]int64{"us": 1})
	c := httpClient(t, trust.Storefront)
	us := edgeURL(d, "us")
	enterErr := func(user, addr string) (answer, error) {
		req, _ := http.NewRequest("POST", us+"/v1/sales/bots/admissions", strings.NewReader(`{"user_id":"`+user+`"}`))
		req.Header.Set("X-Client-Address", addr)
		resp, err := c.Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		a := answer{code: resp.StatusCode, header: resp.Header}
		return a, json.NewDecoder(resp.Body).Decode(&a.body)
	}
	enter := func(user, addr string) answer {
		a, err := enterErr(user, addr)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	var limited answer
	for i := range 20 {
		if a := enter("bot", "10.0.0."+itoa(i)); a.code == http.StatusTooManyRequests {
			limited = a
			break
		}
	}
	if limited.code != http.StatusTooManyRequests || limited.errCode() != "OVERLOADED" || limited.header.Get("Retry-After") == "" {
		t.Fatalf("one buyer entering 20 times at once was never limited: %d %v %v", limited.code, limited.header, limited.body)
	}
	if a := enter("human", "10.0.1.1"); a.code >= 400 {
		t.Fatalf("another buyer was held up by the bot: %d %v", a.code, a.body)
	}
	// 400 buyers from one address, 20 at a time: far faster than the address's rate (50/s
	// after a burst of 200) however slow the machine is.
	var crowdLimited atomic.Int64
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 400 && crowdLimited.Load() == 0; i += 20 {
				a, err := enterErr("crowd"+itoa(i), "10.9.9.9")
				if err != nil {
					t.Error(err)
					return
				}
				if a.code == http.StatusTooManyRequests {
					crowdLimited.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if crowdLimited.Load() == 0 {
		t.Fatal("400 buyers from one address at once were never limited")
	}
}
