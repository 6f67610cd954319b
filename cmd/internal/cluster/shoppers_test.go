package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// shopperRun is what the shoppers of a flash sale saw.
type shopperRun struct {
	granted, soldOut, bound, exhausted, throttled, other atomic.Int64
	failedOver                                           atomic.Int64 // NOT_LEADER or an admission a new leader does not know
	lastGrant                                            atomic.Int64 // unix nanoseconds of the last reservation granted
	lateQueued                                           atomic.Int64 // "queued" answers more than 2 s after the last grant
	unexpected                                           sync.Map     // answer → count, for the log
}

func (r *shopperRun) odd(what string) {
	r.other.Add(1)
	v, _ := r.unexpected.LoadOrStore(what, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// shopper is one buyer: it enters the waiting room of every region (home first), follows
// each answer (polling a queued admission when its Retry-After says), and reserves the cap
// with the first ticket it gets.
type shopper struct {
	t       *testing.T
	c       *http.Client
	sale    string
	user    string
	addr    string
	regions []string // base URLs, home first
	run     *shopperRun
}

func (s *shopper) do(method, url string, body any) (int, map[string]any) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		s.t.Error(err)
		return 0, nil
	}
	req.Header.Set("X-Client-Address", s.addr)
	resp, err := s.c.Do(req)
	if err != nil {
		return 0, map[string]any{"transport": err.Error()}
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return resp.StatusCode, map[string]any{"decode": err.Error()}
	}
	return resp.StatusCode, out
}

func errCodeOf(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// Where a shopper is with one region.
const (
	toEnter = iota // enter (again: after NOT_LEADER, or an admission a new leader does not know)
	toPoll         // queued: poll the admission
	done           // that region said its last word
)

// shop runs the shopper to the end: a reservation, or every region saying no. Like a
// storefront, it asks again after NOT_LEADER (a region failing over) and enters again when a
// new leader does not know its admission; each region is asked at most 400 times.
func (s *shopper) shop(ctx context.Context) {
	state, ids := make([]int, len(s.regions)), make([]string, len(s.regions))
	for round := 0; round < 400 && ctx.Err() == nil; round++ {
		left := 0
		for i, base := range s.regions {
			var code int
			var body map[string]any
			switch state[i] {
			case toEnter:
				code, body = s.do("POST", base+"/v1/sales/"+s.sale+"/admissions", map[string]string{"user_id": s.user})
			case toPoll:
				code, body = s.do("GET", base+"/v1/sales/"+s.sale+"/admissions/"+ids[i], nil)
			default:
				continue
			}
			if s.follow(base, code, body, &state[i], &ids[i]) {
				return
			}
			if state[i] != done {
				left++
			}
		}
		if left == 0 {
			return
		}
		time.Sleep(time.Duration(250+rand.IntN(250)) * time.Millisecond)
	}
}

// follow handles one admission answer; it reports whether the shopper is done.
func (s *shopper) follow(base string, code int, body map[string]any, state *int, id *string) bool {
	switch {
	case code == http.StatusAccepted:
		*state, *id = toPoll, body["admission_id"].(string)
		if last := s.run.lastGrant.Load(); last > 0 && time.Since(time.Unix(0, last)) > 2*time.Second {
			s.run.lateQueued.Add(1)
		}
		return false
	case code == http.StatusCreated || code == http.StatusOK && body["ticket"] != nil:
		ticket, _ := body["ticket"].(string)
		return s.reserve(base, ticket)
	}
	*state = done
	switch c := errCodeOf(body); c {
	case "SOLD_OUT":
		s.run.soldOut.Add(1)
		return true
	case "BOUND_ELSEWHERE":
		s.run.bound.Add(1)
	case "OVERLOADED":
		s.run.throttled.Add(1)
	case "NOT_LEADER", "NOT_FOUND":
		s.run.failedOver.Add(1)
		*state = toEnter
	default:
		s.run.odd(fmt.Sprintf("admission %d %s", code, c))
	}
	return false
}

// reserve reserves the cap with ticket, asking again with the same key after NOT_LEADER.
func (s *shopper) reserve(base, ticket string) bool {
	for try := 0; try < 40; try++ {
		code, body := s.do("POST", base+"/v1/sales/"+s.sale+"/reservations",
			map[string]any{"ticket": ticket, "sku": "phone", "quantity": 2, "request_key": s.user + "-1"})
		switch c := errCodeOf(body); {
		case code == http.StatusCreated || code == http.StatusOK:
			s.run.granted.Add(1)
			s.run.lastGrant.Store(time.Now().UnixNano())
		case c == "SOLD_OUT":
			s.run.soldOut.Add(1)
		case c == "REGION_EXHAUSTED":
			s.run.exhausted.Add(1)
		case c == "BOUND_ELSEWHERE": // admitted here before the binding answered another region
			s.run.bound.Add(1)
		case c == "NOT_LEADER" || c == "UNKNOWN_OUTCOME" || code == 0:
			s.run.failedOver.Add(1)
			time.Sleep(250 * time.Millisecond)
			continue
		default:
			s.run.odd(fmt.Sprintf("reserve %d %s", code, c))
		}
		return true
	}
	s.run.odd("reserve: no answer after 40 tries")
	return true
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestShoppersOverThreeRegions is the storefront's headline promise over real HTTP: many
// shoppers, each trying all three regions' waiting rooms, a cap of 2 per buyer, admission at
// 2,000 buyers per second per region: exactly the stock is held, no buyer holds more than
// 2 units across the regions, queued buyers hear SOLD_OUT soon after the last unit goes,
// and the audit is clean. make test runs 10,000 shoppers for 1,000 units beside every other
// package; `make shoppers` runs the full 100,000 for 10,000 and asserts the 2 s bound
// (QUOTA_SHOPPERS, QUOTA_SHOPPER_UNITS and QUOTA_SHOPPERS_TIMING=1).
func TestShoppersOverThreeRegions(t *testing.T) {
	shoppers, units := envInt("QUOTA_SHOPPERS", 10_000), envInt("QUOTA_SHOPPER_UNITS", 1_000)
	d := startDev(t, "us", "eu", "ap")
	// Holds last 10 minutes: the check counts held and sold units, and on a machine busy enough
	// to stretch the run past a minute, holds of 60 s would expire (their units back, their
	// buyers gone) before it counts.
	createWaitingSaleHolding(t, d, "flash", int64(units), 2000, map[string]int64{"us": 40, "eu": 35, "ap": 25}, 10*time.Minute)
	bases := []string{edgeURL(d, "us"), edgeURL(d, "eu"), edgeURL(d, "ap")}
	c := httpClient(t, trust.Storefront)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	for _, base := range bases {
		// One connection per region first, as a storefront's backend keeps: the shoppers'
		// requests share it (HTTP/2) instead of each dialing at once, which the per-address
		// bound on handshakes refuses past 32.
		if a := call(t, c, "GET", base+"/v1/ping", nil); a.code != http.StatusOK {
			t.Fatalf("ping %s: %d %v", base, a.code, a.body)
		}
	}
	run := &shopperRun{}
	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				home := i % 3
				s := &shopper{t: t, c: c, sale: "flash", user: "u" + itoa(i), run: run,
					addr:    fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
					regions: []string{bases[home], bases[(home+1)%3], bases[(home+2)%3]}}
				s.shop(ctx)
			}
		}()
	}
	for i := 0; i < shoppers && ctx.Err() == nil; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	took := time.Since(start)
	t.Logf("%d shoppers in %s: granted %d, sold out %d, bound elsewhere %d, region exhausted %d, throttled %d, asked again after a failover %d, other %d, queued >2 s after the last grant %d",
		shoppers, took.Round(time.Millisecond), run.granted.Load(), run.soldOut.Load(), run.bound.Load(), run.exhausted.Load(),
		run.throttled.Load(), run.failedOver.Load(), run.other.Load(), run.lateQueued.Load())
	run.unexpected.Range(func(k, v any) bool {
		t.Errorf("unexpected answers: %s × %d", k, v.(*atomic.Int64).Load())
		return true
	})
	if ctx.Err() != nil {
		t.Fatalf("the shoppers did not finish in time: %v", ctx.Err())
	}
	checkHeldAcrossRegions(t, d, "flash", int64(units), 2)
	// The 2 s bound holds on a quiet machine (make shoppers asserts it); under make test the
	// other packages share the two cores, the flags lag, and leaders may even lose their
	// leases (the shoppers then ask again), so it is reported there.
	if n := run.lateQueued.Load(); n > 0 && os.Getenv("QUOTA_SHOPPERS_TIMING") == "1" {
		t.Errorf("%d answers still said queued more than 2 s after the last unit went", n)
	} else if n > 0 {
		t.Logf("%d answers still said queued more than 2 s after the last unit went (asserted only with QUOTA_SHOPPERS_TIMING=1)", n)
	}
	auditOK(t, quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Auditor)), "flash")
}

// checkHeldAcrossRegions reads every region's database: the held and sold units of sale sum
// to want, and no buyer has more than capPerUser across the regions.
func checkHeldAcrossRegions(t *testing.T, d *cluster.Dev, sale string, want, capPerUser int64) {
	t.Helper()
	ctx := context.Background()
	perUser := map[string]int64{}
	var total int64
	for _, n := range d.Regions {
		db, err := pgxpool.New(ctx, d.DBURLs[n.R.Name()])
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query(ctx, `SELECT user_id, sum(quantity) FROM holds WHERE sale_id = $1 AND state IN ('held', 'sold') GROUP BY user_id`, sale)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var u string
			var q int64
			if err := rows.Scan(&u, &q); err != nil {
				t.Fatal(err)
			}
			perUser[u] += q
			total += q
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	if total != want {
		t.Errorf("%d units held or sold across the regions; want exactly %d", total, want)
	}
	for u, q := range perUser {
		if q > capPerUser {
			t.Errorf("buyer %s holds %d units across the regions; the cap is %d", u, q, capPerUser)
		}
	}
	t.Logf("%d units held by %d buyers across %d regions", total, len(perUser), len(d.Regions))
}
