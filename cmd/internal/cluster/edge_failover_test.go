package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/region/regionhttp"
)

// spreadAddrs gives each request it carries its own buyer address (the storefront's
// X-Client-Address), so that one test process entering hundreds of buyers is not held to
// the per-address admission limit meant for one real client.
type spreadAddrs struct {
	rt     http.RoundTripper
	prefix string
	n      atomic.Int64
}

func (s *spreadAddrs) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	n := s.n.Add(1)
	r.Header.Set(regionhttp.ClientAddressHeader, fmt.Sprintf("%s.%d.%d", s.prefix, n/250%250, n%250+1))
	return s.rt.RoundTrip(r)
}

// spreadClient is a storefront HTTP client whose every request comes from another address.
func spreadClient(t *testing.T, prefix string) *http.Client {
	c := httpClient(t, trust.Storefront)
	c.Transport = &spreadAddrs{rt: c.Transport, prefix: prefix}
	return c
}

// churnTally counts what the HTTP edges answered the buyers entering during the failover.
type churnTally struct {
	mu         sync.Mutex
	outcomes   map[string]int // "a: 503 NOT_LEADER", "b: refused", ...
	unexpected []string       // answers b must not give
	sent       int
}

func (c *churnTally) add(key string) {
	c.mu.Lock()
	c.outcomes[key]++
	c.mu.Unlock()
}

func (c *churnTally) bad(what string) {
	c.mu.Lock()
	if len(c.unexpected) < 20 {
		c.unexpected = append(c.unexpected, what)
	}
	c.mu.Unlock()
}

// churnEnter enters user at base once; errors are counted, not fatal (the goroutine is not
// the test's).
func churnEnter(ctx context.Context, c *http.Client, base, sale, user string) (code int, reason string, err error) {
	body, _ := json.Marshal(map[string]string{"user_id": user})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/sales/"+sale+"/admissions", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	a := answer{code: resp.StatusCode}
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &a.body)
	}
	return a.code, a.errCode(), nil
}

// TestTicketsSurviveARegionFailover: tickets are signed with the cluster's key file and
// their one use is recorded with the hold in SQL, so a region's failover to its standby
// loses none of them. The leader admits 200 buyers and half of them reserve; it is then
// killed (its lease left to expire) while new buyers keep knocking at both nodes' edges.
// Once the standby leads, at its edge: every unused ticket the dead leader issued reserves,
// every used one replays its hold under its request key and is refused TICKET_USED under
// another, a buyer admitted before entering again gets their used admission back (bound to
// the same region, never BOUND_ELSEWHERE), nobody holds more than the per-user limit in SQL, and the
// coordinator's audit is clean.
func TestTicketsSurviveARegionFailover(t *testing.T) {
	t.Parallel() // its own cluster, no time bound (newTestCluster)
	const (
		ttl    = 2 * time.Second
		sale   = "edgefo"
		buyers = 200
		limit  = 2
	)
	e, err := fencing.StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	etcd, err := fencing.Dial([]string{e.ClientURL}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	keys := filepath.Join(t.TempDir(), cluster.TicketKeysFile)
	if _, err := cluster.EnsureTicketKeys(keys); err != nil {
		t.Fatal(err)
	}
	db := testpg.NewDB(t, "edgefo")
	start := func() *cluster.RegionNode {
		n, err := cluster.StartRegion(ctx, cluster.RegionConfig{Region: region.Config{Name: "us", Verify: verify()}, Listen: "127.0.0.1:0",
			HTTPListen: "127.0.0.1:0", TicketKeys: keys, DBURL: db, LeaseTTL: ttl, TLS: certs, Logger: testLogger()}, etcd)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		return n
	}
	a := start()
	if err := a.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	b := start() // the warm standby
	coordNode, err := cluster.StartCoordinator(ctx, cluster.CoordinatorConfig{Listen: "127.0.0.1:0", DBURL: testpg.NewDB(t, "ledger"),
		Regions: []cluster.RegionEndpoint{{Name: "us", Addr: a.Addr(), DBURL: db}}, LeaseTTL: ttl, FollowLeaders: true, TLS: certs, Logger: testLogger()}, etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coordNode.Close)
	if err := coordNode.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	coord := quotav1.NewCoordinatorServiceClient(dial(t, coordNode.Addr(), trust.Operator))
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 1000}},
		PerUserLimit: limit, HoldTtlMs: 600000, AdmitRate: 500, TicketTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc", Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	atA, atB := "https://"+a.HTTPAddr(), "https://"+b.HTTPAddr()
	c := spreadClient(t, "10.1")

	// The leader admits every buyer: enter them all, then poll each until it has a ticket.
	user := func(i int) string { return "buyer-" + itoa(i) }
	ids := make([]string, buyers)
	for i := range buyers {
		en := call(t, c, "POST", atA+"/v1/sales/"+sale+"/admissions", map[string]string{"user_id": user(i)})
		if (en.code != http.StatusAccepted && en.code != http.StatusCreated) || en.str("admission_id") == "" {
			t.Fatalf("%s entering at a: %d %v", user(i), en.code, en.body)
		}
		ids[i] = en.str("admission_id")
	}
	pollTicket := func(base string, i int, id string) answer {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			g := call(t, c, "GET", base+"/v1/sales/"+sale+"/admissions/"+id, nil)
			if g.str("ticket") != "" {
				if g.str("state") != "admitted" {
					t.Fatalf("%s: a ticket in state %q: %v", user(i), g.str("state"), g.body)
				}
				return g
			}
			if g.code != http.StatusAccepted || time.Now().After(deadline) {
				t.Fatalf("%s's admission %s at %s: %d %v", user(i), id, base, g.code, g.body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	tickets := make([]string, buyers)
	for i, id := range ids {
		tickets[i] = pollTicket(atA, i, id).str("ticket")
	}
	// Half of them reserve at the leader.
	key := func(i int) string { return "k-" + user(i) }
	holds := make([]string, buyers/2)
	for i := range buyers / 2 {
		r := reserveWith(t, c, atA, sale, tickets[i], key(i), 1)
		if r.code != http.StatusCreated || r.str("hold_id") == "" || r.str("user_id") != user(i) || r.str("admission_id") != ids[i] {
			t.Fatalf("%s reserving at a: %d %v", user(i), r.code, r.body)
		}
		holds[i] = r.str("hold_id")
	}

	// New buyers keep knocking at both edges while the leader dies and the standby takes
	// over: bounded by count and time, and stopped before the checks at the end.
	tally := &churnTally{outcomes: map[string]int{}}
	churnCtx, stopChurn := context.WithTimeout(ctx, 30*time.Second)
	defer stopChurn()
	churnDone := make(chan struct{})
	cc := spreadClient(t, "10.2")
	cc.Timeout = 3 * time.Second
	go func() {
		defer close(churnDone)
		for i := 0; i < 4000 && churnCtx.Err() == nil; i++ {
			node, base := "a", atA
			if i%2 == 1 {
				node, base = "b", atB
			}
			code, reason, err := churnEnter(churnCtx, cc, base, sale, "churn-"+itoa(i))
			tally.mu.Lock()
			tally.sent++
			tally.mu.Unlock()
			switch {
			case churnCtx.Err() != nil:
				return
			case errors.Is(err, syscall.ECONNREFUSED):
				tally.add(node + ": connection refused")
				if node == "b" {
					tally.bad("b refused a connection")
				}
			case err != nil:
				tally.add(node + ": transport error")
				if node == "b" {
					tally.bad(fmt.Sprintf("b: %v", err))
				}
			default:
				tally.add(fmt.Sprintf("%s: %d %s", node, code, reason))
				if node == "b" && code >= 300 && reason != "NOT_LEADER" {
					tally.bad(fmt.Sprintf("b answered %d %s", code, reason))
				}
				if reason == "BOUND_ELSEWHERE" {
					tally.bad(fmt.Sprintf("%s answered BOUND_ELSEWHERE to a new buyer", node))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond) // some new buyers reach the leader before it dies

	killed := time.Now()
	a.Crash()
	// Until the standby leads, one unused ticket is tried at its edge: NOT_LEADER, then 201.
	probe := buyers / 2
	var led, firstReserved time.Duration
	var first answer
	for deadline := killed.Add(ttl + 10*time.Second); ; {
		if led == 0 && b.R.Leading() {
			led = time.Since(killed)
		}
		r := reserveWith(t, c, atB, sale, tickets[probe], key(probe), 1)
		if r.code == http.StatusCreated {
			firstReserved = time.Since(killed)
			if led == 0 {
				led = firstReserved
			}
			first = r
			break
		}
		if r.code != http.StatusServiceUnavailable || r.errCode() != "NOT_LEADER" {
			t.Fatalf("an unused ticket of a at b, %s after the crash (b leading: %v): %d %v, want 503 NOT_LEADER until b leads, then 201",
				time.Since(killed).Round(time.Millisecond), b.R.Leading(), r.code, r.body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never reserved a ticket of a within %s of the crash (leading: %v): %d %v", ttl+10*time.Second, b.R.Leading(), r.code, r.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the crash: b leads in %s, reserves its first ticket of a in %s (lease TTL %s)",
		led.Round(time.Millisecond), firstReserved.Round(time.Millisecond), ttl)
	if first.str("user_id") != user(probe) || first.str("admission_id") != ids[probe] || first.str("state") != "held" || first.str("region") != "us" {
		t.Fatalf("the first reservation at b: %v", first.body)
	}

	// (1) Every unused ticket a issued reserves at b.
	for i := buyers/2 + 1; i < buyers; i++ {
		r := reserveWith(t, c, atB, sale, tickets[i], key(i), 1)
		if r.code != http.StatusCreated || r.str("user_id") != user(i) || r.str("admission_id") != ids[i] || r.str("state") != "held" {
			t.Errorf("unused ticket of %s at b: %d %v, want 201 held", user(i), r.code, r.body)
		}
	}
	// (2) Every used ticket replays its hold under its key, and backs no other key.
	for i := range buyers / 2 {
		r := reserveWith(t, c, atB, sale, tickets[i], key(i), 1)
		if r.code != http.StatusOK || r.str("hold_id") != holds[i] || r.body["replayed"] != true {
			t.Errorf("replay of %s's ticket at b: %d %v, want 200 replaying hold %s", user(i), r.code, r.body, holds[i])
		}
		o := reserveWith(t, c, atB, sale, tickets[i], key(i)+"-again", 1)
		if o.code != http.StatusConflict || o.errCode() != "TICKET_USED" {
			t.Errorf("%s's used ticket under another key at b: %d %v, want 409 TICKET_USED", user(i), o.code, o.body)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	stopChurn()
	<-churnDone
	tally.mu.Lock()
	var seen []string
	for k, n := range tally.outcomes {
		seen = append(seen, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(seen)
	t.Logf("%d new buyers entered during the failover: %s", tally.sent, strings.Join(seen, ", "))
	for _, u := range tally.unexpected {
		t.Errorf("during the failover: %s", u)
	}
	tally.mu.Unlock()

	// (3) The buyers a admitted enter again at b: the failover kept their admission, used (its
	// ticket backs their hold), so they get it back, with no second ticket, and stay bound to
	// us.
	for i := range buyers {
		en := call(t, c, "POST", atB+"/v1/sales/"+sale+"/admissions", map[string]string{"user_id": user(i)})
		if en.code != http.StatusOK || en.str("admission_id") != ids[i] || en.str("state") != "used" || en.str("ticket") != "" {
			t.Fatalf("%s entering again at b: %d %v, want 200 used, admission %s, no ticket", user(i), en.code, en.body, ids[i])
		}
		if bound, ok, err := fencing.Bound(ctx, etcd, sale, user(i)); err != nil || !ok || bound != "us" {
			t.Fatalf("%s's binding after entering again: %q %v %v, want us", user(i), bound, ok, err)
		}
	}

	// The per-user limit holds over every stored hold, and the audit is clean.
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT user_id, sum(quantity) FROM holds WHERE state IN ('held','sold') GROUP BY user_id`)
	if err != nil {
		t.Fatal(err)
	}
	perUser := map[string]int64{}
	for rows.Next() {
		var u string
		var q int64
		if err := rows.Scan(&u, &q); err != nil {
			t.Fatal(err)
		}
		perUser[u] = q
		if q > limit {
			t.Errorf("user %s holds %d units, over the per-user limit %d", u, q, limit)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var units int64
	for i := range buyers {
		if perUser[user(i)] != 1 { // the one unit of their one ticket: a failover hands out no second
			t.Errorf("%s holds %d units in SQL; want 1", user(i), perUser[user(i)])
		}
		units += perUser[user(i)]
	}
	if len(perUser) != buyers {
		t.Errorf("%d users hold units; want the %d buyers", len(perUser), buyers)
	}
	au := auditOK(t, coord, sale)
	if au.GetTotal() != 1000 || au.GetHeld()+au.GetSold() != units {
		t.Fatalf("audit %v; want total 1000 with %d held or sold", au, units)
	}
}
