package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
)

// edgeCluster is region us as two processes (a leads, b stands by) on one database, a
// coordinator, and the storefront edges a test starts in front of them.
type edgeCluster struct {
	t     *testing.T
	ctx   context.Context
	a, b  *cluster.RegionNode
	keys  string
	coord quotav1.CoordinatorServiceClient
}

const edgeLease = 2 * time.Second

func newEdgeCluster(t *testing.T, sale string, total, rate, maxLive int64) *edgeCluster {
	t.Helper()
	return newEdgeClusterOn(t, sale, total, rate, maxLive, false)
}

// newEdgeClusterOn is newEdgeCluster; with standbyOwnDB the standby runs on a database of
// its own, which knows no sale: once it leads, the region has lost the sale.
func newEdgeClusterOn(t *testing.T, sale string, total, rate, maxLive int64, standbyOwnDB bool) *edgeCluster {
	t.Helper()
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
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	ec := &edgeCluster{t: t, ctx: ctx, keys: filepath.Join(t.TempDir(), cluster.TicketKeysFile)}
	if _, err := cluster.EnsureTicketKeys(ec.keys); err != nil {
		t.Fatal(err)
	}
	db := testpg.NewDB(t, "edges")
	start := func(db string) *cluster.RegionNode {
		n, err := cluster.StartRegion(ctx, cluster.RegionConfig{Region: region.Config{Name: "us", Verify: verify()}, Listen: "127.0.0.1:0",
			TicketKeys: ec.keys, DBURL: db, LeaseTTL: edgeLease, TLS: certs, Logger: testLogger()}, etcd)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		return n
	}
	ec.a = start(db)
	if err := ec.a.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	if standbyOwnDB {
		ec.b = start(testpg.NewDB(t, "edges_lost"))
	} else {
		ec.b = start(db)
	}
	cn, err := cluster.StartCoordinator(ctx, cluster.CoordinatorConfig{Listen: "127.0.0.1:0", DBURL: testpg.NewDB(t, "ledger"),
		Regions: []cluster.RegionEndpoint{{Name: "us", Addr: ec.a.Addr(), DBURL: db}}, LeaseTTL: edgeLease, FollowLeaders: true,
		TLS: certs, Logger: testLogger()}, etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cn.Close)
	if err := cn.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	ec.coord = quotav1.NewCoordinatorServiceClient(dial(t, cn.Addr(), trust.Operator))
	if _, err := ec.coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: total}},
		PerUserLimit: 1, HoldTtlMs: 600000, AdmitRate: rate, MaxLiveTickets: maxLive, TicketTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := ec.coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc",
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	return ec
}

// edge starts a storefront edge in front of both region processes (the standby first: the
// edge finds the leader by itself).
func (ec *edgeCluster) edge() *cluster.EdgeNode {
	ec.t.Helper()
	n, err := cluster.StartEdge(cluster.EdgeConfig{Region: "us", Upstream: []string{ec.b.Addr(), ec.a.Addr()}, Listen: "127.0.0.1:0",
		TicketKeys: ec.keys, Refresh: 100 * time.Millisecond, TLS: certs, Logger: testLogger()})
	if err != nil {
		ec.t.Fatal(err)
	}
	ec.t.Cleanup(n.Close)
	return n
}

// leaderPolls is the polls the leader (a) answered; the standby's are NOT_LEADER answers.
func (ec *edgeCluster) leaderPolls() uint64 { return ec.a.Door.Polls() }

// enterAll enters buyers at base and returns their admission ids.
func enterAll(t *testing.T, c *http.Client, base, sale string, users []string) []string {
	t.Helper()
	ids := make([]string, len(users))
	for i, u := range users {
		en := call(t, c, "POST", base+"/v1/sales/"+sale+"/admissions", map[string]string{"user_id": u})
		if (en.code != http.StatusAccepted && en.code != http.StatusCreated) || en.str("admission_id") == "" {
			t.Fatalf("%s entering at %s: %d %v", u, base, en.code, en.body)
		}
		ids[i] = en.str("admission_id")
	}
	return ids
}

// TestEdgesAnswerPollsNotTheLeader: buyers enter through one edge and poll through two
// (half the buyers through each; edges' copies may differ by one refresh, so a buyer's
// position is checked at one edge), until every one is admitted, then reserve with their tickets
// through an edge. The edges answer the polls from the lines the leader feeds them: the
// leader answers only the few an edge's copy did not hold yet, under a tenth of them, and
// every position a buyer hears never grows; every ticket an edge signed reserves at the
// leader.
func TestEdgesAnswerPollsNotTheLeader(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	const sale, buyers = "edgepoll", 60
	ec := newEdgeCluster(t, sale, 1000, 10, 1000)
	e1, e2 := ec.edge(), ec.edge()
	c := httpClient(t, trust.Storefront)
	bases := []string{"https://" + e1.Addr(), "https://" + e2.Addr()}
	users := make([]string, buyers)
	for i := range users {
		users[i] = "buyer-" + itoa(i)
	}
	ids := enterAll(t, c, bases[0], sale, users)
	before := ec.leaderPolls()
	tickets, polls := make([]string, buyers), 0
	last := make([]float64, buyers)
	for deadline := time.Now().Add(time.Minute); ; {
		pending := 0
		for i, id := range ids {
			if tickets[i] != "" {
				continue
			}
			g := call(t, c, "GET", bases[i%2]+"/v1/sales/"+sale+"/admissions/"+id, nil)
			polls++
			switch {
			case g.code == http.StatusAccepted:
				pos, _ := g.body["position"].(float64)
				if last[i] != 0 && pos > last[i] {
					t.Errorf("%s: position %v after %v", users[i], pos, last[i])
				}
				last[i] = pos
				pending++
			case g.str("ticket") != "" && g.str("state") == "admitted":
				tickets[i] = g.str("ticket")
			default:
				t.Fatalf("%s's poll: %d %v", users[i], g.code, g.body)
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d buyers still queued after a minute", pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	atLeader := ec.leaderPolls() - before
	a1, f1 := e1.Edge.Polls()
	a2, f2 := e2.Edge.Polls()
	t.Logf("%d polls: the edges answered %d, forwarded %d; the leader answered %d", polls, a1+a2, f1+f2, atLeader)
	if atLeader != f1+f2 || a1+a2+f1+f2 != uint64(polls) {
		t.Errorf("the counts disagree: leader %d, edges forwarded %d, answered %d of %d polls", atLeader, f1+f2, a1+a2, polls)
	}
	if polls < 4*buyers || atLeader*10 > uint64(polls) {
		t.Errorf("the leader answered %d of %d polls; want under a tenth (and at least 4 polls a buyer)", atLeader, polls)
	}
	for i, tk := range tickets {
		r := reserveWith(t, c, bases[(i+1)%2], sale, tk, "k-"+users[i], 1)
		if r.code != http.StatusCreated || r.str("user_id") != users[i] || r.str("admission_id") != ids[i] {
			t.Fatalf("%s reserving through an edge: %d %v", users[i], r.code, r.body)
		}
	}
	forged := tickets[0][:len(tickets[0])-2] + "AA"
	if r := reserveWith(t, c, bases[0], sale, forged, "k-forged", 1); r.code != http.StatusUnauthorized || r.errCode() != "TICKET_INVALID" {
		t.Errorf("a forged ticket at the edge: %d %v", r.code, r.body)
	}
	auditOK(t, ec.coord, sale)
}

// TestEdgeFollowsAFailover: buyers queue through an edge, some admitted, while the leader
// is killed (Crash: no resignation, its lease runs out): the edge finds the standby once it
// leads, by itself; every queued buyer's poll through the edge shows the same position or a
// better one throughout (never 404), every admitted buyer's ticket reserves through the edge
// after the takeover, and the audit is clean.
func TestEdgeFollowsAFailover(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	const sale, buyers = "edgefail", 40
	ec := newEdgeCluster(t, sale, 1000, 5, 1000)
	e := ec.edge()
	c := httpClient(t, trust.Storefront)
	base := "https://" + e.Addr()
	users := make([]string, buyers)
	for i := range users {
		users[i] = "buyer-" + itoa(i)
	}
	ids := enterAll(t, c, base, sale, users)
	time.Sleep(time.Second) // some are admitted (5 a second), most queue
	last, tickets := make([]float64, buyers), make([]string, buyers)
	pollAll := func(when string) (queued int) {
		for i, id := range ids {
			if tickets[i] != "" {
				continue
			}
			g := call(t, c, "GET", base+"/v1/sales/"+sale+"/admissions/"+id, nil)
			switch {
			case g.code == http.StatusAccepted:
				pos, _ := g.body["position"].(float64)
				if last[i] != 0 && pos > last[i] {
					t.Errorf("%s: %s: position %v after %v", users[i], when, pos, last[i])
				}
				last[i] = pos
				queued++
			case g.str("ticket") != "":
				tickets[i] = g.str("ticket")
			case g.code == http.StatusServiceUnavailable && g.errCode() == "NOT_LEADER":
				queued++ // unknown to the edge's copy and no leader yet: ask again
			default:
				t.Fatalf("%s: %s: poll %d %v", users[i], when, g.code, g.body)
			}
		}
		return queued
	}
	if pollAll("before the kill") == buyers {
		t.Fatal("no buyer admitted before the kill")
	}
	ec.a.Crash()
	killed := time.Now()
	for !ec.b.R.Leading() {
		pollAll("during the failover")
		if time.Since(killed) > 30*time.Second {
			t.Fatal("b never led")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for deadline := time.Now().Add(time.Minute); pollAll("after the takeover") > 0; {
		if time.Now().After(deadline) {
			t.Fatal("buyers still queued a minute after the takeover")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i, tk := range tickets {
		r := reserveWith(t, c, base, sale, tk, "k-"+users[i], 1)
		if r.code != http.StatusCreated || r.str("user_id") != users[i] {
			t.Fatalf("%s reserving through the edge after the takeover: %d %v", users[i], r.code, r.body)
		}
	}
	auditOK(t, ec.coord, sale)
}

// TestEdgesDieFreely: storefronts enter, poll and reserve through edge 1, which is closed
// mid-sale (its listener and every connection cut); each storefront carries on against edge
// 2 with the same request keys. No acknowledged hold is lost, no buyer holds twice, the
// units held never pass the stock, and the audit is clean.
func TestEdgesDieFreely(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	const sale, buyers, stock = "edgedie", 80, 50
	ec := newEdgeCluster(t, sale, stock, 40, 20)
	e1, e2 := ec.edge(), ec.edge()
	c := httpClient(t, trust.Storefront)
	c.Timeout = 3 * time.Second
	var mu sync.Mutex
	acked := map[string]string{} // user -> hold id acknowledged to the storefront
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < buyers; i += 8 {
				if h := shopThroughEdges(ec.ctx, c, []string{"https://" + e1.Addr(), "https://" + e2.Addr()}, sale, "buyer-"+itoa(i)); h != "" {
					mu.Lock()
					acked["buyer-"+itoa(i)] = h
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	e1.Close()
	wg.Wait()
	for i := range buyers {
		user := "buyer-" + itoa(i)
		g := call(t, c, "GET", "https://"+e2.Addr()+"/v1/sales/"+sale+"/buyers/"+user+"/holds", nil)
		hs, _ := g.body["holds"].([]any)
		if g.code != http.StatusOK || len(hs) > 1 || (len(hs) == 1) != (acked[user] != "") {
			t.Errorf("%s's holds: %d %v (acknowledged: %q)", user, g.code, g.body, acked[user])
		}
	}
	for user, hold := range acked {
		g := call(t, c, "GET", "https://"+e2.Addr()+"/v1/holds/"+hold, nil)
		if g.code != http.StatusOK || g.str("user_id") != user || g.str("state") != "held" {
			t.Errorf("%s's acknowledged hold %s: %d %v", user, hold, g.code, g.body)
		}
	}
	if len(acked) == 0 || len(acked) > stock {
		t.Errorf("%d holds acknowledged, want 1..%d", len(acked), stock)
	}
	pool := auditOK(t, ec.coord, sale)
	t.Logf("%d of %d buyers hold a unit; audit %v", len(acked), buyers, pool)
}

// shopThroughEdges is one storefront's buyer: enter, poll until admitted, reserve with the
// ticket under one request key, going to the next edge whenever one does not answer
// (a transport error) and asking again with the same key. It returns the hold acknowledged,
// or "" (sold out, or out of time).
func shopThroughEdges(ctx context.Context, c *http.Client, bases []string, sale, user string) string {
	edge := 0
	try := func(method, path string, body any) (answer, bool) {
		for range 20 {
			if ctx.Err() != nil {
				return answer{}, false
			}
			a, err := tryCall(c, method, bases[edge]+path, body)
			if err == nil && a.code != http.StatusServiceUnavailable {
				return a, true
			}
			if err != nil {
				edge = (edge + 1) % len(bases)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return answer{}, false
	}
	en, ok := try("POST", "/v1/sales/"+sale+"/admissions", map[string]string{"user_id": user})
	for deadline := time.Now().Add(45 * time.Second); ok && en.code == http.StatusAccepted && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		en, ok = try("GET", "/v1/sales/"+sale+"/admissions/"+en.str("admission_id"), nil)
	}
	if !ok || en.str("ticket") == "" {
		return ""
	}
	r, ok := try("POST", "/v1/sales/"+sale+"/reservations", map[string]any{"ticket": en.str("ticket"), "sku": "phone", "quantity": 1, "request_key": "k-" + user})
	if !ok || (r.code != http.StatusCreated && r.code != http.StatusOK) {
		return ""
	}
	return r.str("hold_id")
}

// tryCall is call that answers a transport error instead of failing the test.
func tryCall(c *http.Client, method, url string, body any) (answer, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return answer{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{code: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			return a, err
		}
	}
	return a, nil
}

// TestDevRunsEdges: quotad dev --edges 2 starts two storefront edges in front of its
// region; a buyer enters, is admitted and reserves through them, and the edges answer
// the polls.
func TestDevRunsEdges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := "quota_t_" + randHex(t)
	d, err := cluster.StartDev(ctx, cluster.DevConfig{Regions: []string{"us"}, PGURL: testpg.AdminURL(), DBPrefix: prefix,
		DataDir: t.TempDir(), Host: "127.0.0.1", LeaseTTL: 2 * time.Second, Logger: testLogger(), Region: region.Config{Verify: verify()},
		CertsDir: certs.Dir(), Edges: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		dropDBs(t, prefix, []string{"us"})
	})
	if len(d.Edges["us"]) != 2 {
		t.Fatalf("edges of us: %d, want 2", len(d.Edges["us"]))
	}
	createWaitingSale(t, d, "devedge", 10, 100, map[string]int64{"us": 1})
	c := httpClient(t, trust.Storefront)
	e1, e2 := "https://"+d.Edges["us"][0].Addr(), "https://"+d.Edges["us"][1].Addr()
	en := call(t, c, "POST", e1+"/v1/sales/devedge/admissions", map[string]string{"user_id": "alice"})
	var a answer
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if a = call(t, c, "GET", e2+"/v1/sales/devedge/admissions/"+en.str("admission_id"), nil); a.str("ticket") != "" || time.Now().After(deadline) {
			break
		}
	}
	if r := reserveWith(t, c, e2, "devedge", a.str("ticket"), "k1", 1); r.code != http.StatusCreated || r.str("user_id") != "alice" {
		t.Fatalf("reserve through the dev edge: %d %v (admission %v)", r.code, r.body, a.body)
	}
	time.Sleep(600 * time.Millisecond) // the edge's next fetches of the line it now watches
	if g := call(t, c, "GET", e2+"/v1/sales/devedge/admissions/"+en.str("admission_id"), nil); g.str("state") != "used" {
		t.Errorf("the used admission through the edge: %d %v", g.code, g.body)
	}
	if answered, _ := d.Edges["us"][1].Edge.Polls(); answered == 0 {
		t.Error("the edge answered no poll itself")
	}
}

// TestCartsThroughAnEdge: a cart reserved, replayed, read, confirmed and released through a
// storefront edge is what the leader decided (I10); a refused cart's 409 names its line's SKU
// at the edge as at the region.
func TestCartsThroughAnEdge(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	ec := newEdgeCluster(t, "edgequeue", 10, 10, 10)
	if _, err := ec.coord.CreateSale(ec.ctx, &quotav1.CreateSaleRequest{SaleId: "edgecart", PerUserLimit: 2, HoldTtlMs: 600000,
		Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 10}, {Sku: "case", Total: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ec.coord.Allocate(ec.ctx, &quotav1.AllocateRequest{SaleId: "edgecart", RequestId: "alloc-cart",
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	base := "https://" + ec.edge().Addr()
	c := httpClient(t, trust.Storefront)
	lines := []map[string]any{{"sku": "phone", "quantity": 1}, {"sku": "case", "quantity": 1}}
	cart := map[string]any{"user_id": "ann", "request_key": "cart-1", "lines": lines}
	r := call(t, c, "POST", base+"/v1/sales/edgecart/reservations", cart)
	holds, _ := r.body["holds"].([]any)
	if r.code != http.StatusCreated || r.str("cart_id") == "" || len(holds) != 2 {
		t.Fatalf("a cart through the edge: %d %v; want 201 with a cart id and 2 holds", r.code, r.body)
	}
	id := r.str("cart_id")
	if again := call(t, c, "POST", base+"/v1/sales/edgecart/reservations", cart); again.code != http.StatusOK || again.str("cart_id") != id {
		t.Errorf("the cart retried with its key: %d %v; want 200 and cart %s", again.code, again.body, id)
	}
	if g := call(t, c, "GET", base+"/v1/carts/"+id, nil); g.code != http.StatusOK || len(g.body["holds"].([]any)) != 2 {
		t.Errorf("GET the cart through the edge: %d %v", g.code, g.body)
	}
	refused := call(t, c, "POST", base+"/v1/sales/edgecart/reservations", map[string]any{"user_id": "bob", "request_key": "cart-2", "lines": lines})
	if refused.code != http.StatusConflict || refused.errField("sku") != "case" {
		t.Errorf("a cart whose case is gone, through the edge: %d %v; want 409 naming sku case", refused.code, refused.body)
	}
	if cf := call(t, c, "POST", base+"/v1/carts/"+id+"/confirm", map[string]string{"payment_id": "pay-1"}); cf.code != http.StatusOK || cf.str("outcome") != "sold" {
		t.Errorf("the cart's confirm through the edge: %d %v; want sold", cf.code, cf.body)
	}
	if rel := call(t, c, "POST", base+"/v1/carts/"+id+"/release", nil); rel.code != http.StatusConflict {
		t.Errorf("releasing a sold cart through the edge: %d %v; want 409", rel.code, rel.body)
	}
	if a, err := ec.coord.Audit(ec.ctx, &quotav1.AuditRequest{SaleId: "edgecart"}); err != nil || !a.GetOk() || len(a.GetSkus()) != 2 {
		t.Errorf("audit: %v %v", a, err)
	}
}
