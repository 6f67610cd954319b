package local_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/trust"
)

// httpOffset is how far above its gRPC port a region process of the script serves the
// storefront HTTP API itself (--http-listen): region-us at base+1101, region-us-2 at base+1111.
// The regions' storefront addresses (base+1001, ...) are their edges' (storefrontOf).
const httpOffset = 1100

// edgeOf is the storefront HTTP listener of the region process whose gRPC address is grpcAddr.
func edgeOf(t *testing.T, grpcAddr string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(grpcAddr)
	if err != nil {
		t.Fatalf("region address %q: %v", grpcAddr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("region address %q: %v", grpcAddr, err)
	}
	return "https://" + net.JoinHostPort(host, strconv.Itoa(p+httpOffset))
}

// buyerAddrs gives each request its own synthetic buyer address (X-Client-Address, which the
// edge honours from the storefront role), so that one test process entering hundreds of
// buyers is not held to the per-address admission limit (50/s, burst 200) of one real client.
type buyerAddrs struct {
	rt     http.RoundTripper
	prefix string
	n      atomic.Int64
}

func (b *buyerAddrs) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	n := b.n.Add(1)
	r.Header.Set("X-Client-Address", fmt.Sprintf("%s.%d.%d", b.prefix, n/250%250, n%250+1))
	return b.rt.RoundTrip(r)
}

// edgeClient is a storefront's HTTP client (mTLS with the cluster's storefront certificate)
// whose every request comes from another buyer address under prefix ("10.1": 10.1.x.y).
func (c *localCluster) edgeClient(prefix string, timeout time.Duration) *http.Client {
	c.t.Helper()
	m, err := trust.Load(c.certsDir())
	if err != nil {
		c.t.Fatal(err)
	}
	cfg, err := m.ClientConfig(trust.Storefront)
	if err != nil {
		c.t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16}
	c.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: &buyerAddrs{rt: tr, prefix: prefix}, Timeout: timeout}
}

// edgeAnswer is one answer of an HTTP edge, its JSON decoded loosely.
type edgeAnswer struct {
	code int
	body map[string]any
}

func (a edgeAnswer) str(k string) string { s, _ := a.body[k].(string); return s }

func (a edgeAnswer) errCode() string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (a edgeAnswer) errStr(k string) string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e[k].(string)
	return s
}

// edgeDo sends one request; a transport error is returned, not fatal (goroutines use it).
func edgeDo(ctx context.Context, hc *http.Client, method, u string, body any) (edgeAnswer, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return edgeAnswer{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return edgeAnswer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return edgeAnswer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return edgeAnswer{code: resp.StatusCode}, err
	}
	a := edgeAnswer{code: resp.StatusCode}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			return a, fmt.Errorf("%s %s: %d, not JSON: %q", method, u, resp.StatusCode, raw)
		}
	}
	return a, nil
}

// edgeCall is edgeDo for the test's goroutine: a transport error fails the test.
func edgeCall(ctx context.Context, t *testing.T, hc *http.Client, method, u string, body any) edgeAnswer {
	t.Helper()
	a, err := edgeDo(ctx, hc, method, u, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	return a
}

// edgeTally counts what the edges answered the buyers entering during the kill.
type edgeTally struct {
	mu         sync.Mutex
	outcomes   map[string]int // "us: 202", "us-2: 503 NOT_LEADER", "us: connection refused", ...
	unexpected []string
	sent       int
}

func (e *edgeTally) add(key string) {
	e.mu.Lock()
	e.sent++
	e.outcomes[key]++
	e.mu.Unlock()
}

func (e *edgeTally) bad(what string) {
	e.mu.Lock()
	if len(e.unexpected) < 20 {
		e.unexpected = append(e.unexpected, what)
	}
	e.mu.Unlock()
}

// TestLocalTicketsSurviveKill9 is TestTicketsSurviveARegionFailover (cmd/internal/cluster) on
// real processes: every region process serves the storefront HTTP edge with the cluster's one
// ticket key file. The leader of us (region-us) admits 100 buyers through its waiting room and
// half of them reserve (a few pay); then `cluster kill region-us` (SIGKILL) while new buyers
// keep entering at both of us's edges. Once region-us-2 leads, at its edge: every unused
// ticket the dead leader signed reserves, every used one replays its hold under its request
// key and is refused TICKET_USED under another, the buyers entering again get their used admission back at us
// (bound to it in etcd, never BOUND_ELSEWHERE) and cannot go over the per-user limit, the
// region's database holds at most 2 units per user, and the audit is clean.
func TestLocalTicketsSurviveKill9(t *testing.T) {
	const (
		ttl      = 2 * time.Second
		sale     = "edge"
		buyers   = 100
		paying   = 10 // of the buyers who reserve before the kill, these pay too
		limit    = 2
		total    = 1200
		churnN   = 2000             // at most this many new buyers enter during the kill ...
		churnFor = 20 * time.Second // ... for at most this long
	)
	started := time.Now()
	c := newLocalCluster(t, "ef", "QUOTA_CLUSTER_LEASE_TTL="+ttl.String())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	up := time.Now()
	out := c.cluster(5*time.Minute, "up")
	t.Logf("cluster up: %s\n%s", time.Since(up).Round(time.Millisecond), out)
	st := c.status()
	c.wantState(st, "running", processes...)
	if !strings.Contains(st["region-us"], "leader") || !strings.Contains(st["region-us-2"], "standby") {
		t.Fatalf("want region-us leading and region-us-2 standing by:\nregion-us %s\nregion-us-2 %s", st["region-us"], st["region-us-2"])
	}
	for name, off := range map[string]int{"region-us": 1, "region-us-2": 11, "region-ap-2": 13} {
		if want := fmt.Sprintf("http :%d", c.base+off+httpOffset); !strings.Contains(st[name], want) {
			t.Errorf("status of %s: %q, want its HTTP port (%s)", name, st[name], want)
		}
	}
	keys := filepath.Join(c.certsDir(), "tickets.keys")
	if fi, err := os.Stat(keys); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the ticket key file %s: %v %v, want it made by up with mode 0600", keys, fi, err)
	}

	coord := c.addr(0)
	opCreds := c.creds(trust.Operator)
	if out, err := c.quotactl(coord, "sale", "create", "--sale", sale, "--sku", "phone="+strconv.Itoa(total),
		"--per-user-limit", strconv.Itoa(limit), "--hold-ttl", "10m", "--admit-rate", "500", "--ticket-ttl", "2m",
		"--allocate", "us=1,eu=1,ap=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	// The buyers go to the edge of us's current leader, as the coordinator lists it.
	var leader string
	c.eventually(10*time.Second, "the coordinator lists us's leader", func() error {
		if leader = currentRegionAddr(ctx, opCreds, coord, "us"); leader == "" {
			return errors.New("no address for us")
		}
		return nil
	})
	if leader != c.addr(1) {
		t.Fatalf("us's leader is at %s, want region-us (%s)", leader, c.addr(1))
	}
	atA, atB, atEU := edgeOf(t, leader), edgeOf(t, c.addr(11)), edgeOf(t, c.addr(2))
	hc := c.edgeClient("10.1", 5*time.Second)
	t.Logf("edges: region-us %s, region-us-2 %s, region-eu %s", atA, atB, atEU)

	// The leader admits every buyer: enter them all, then poll each until it has a ticket.
	user := func(i int) string { return "buyer-" + strconv.Itoa(i) }
	key := func(i int) string { return "k-" + user(i) }
	admissions := func(base string) string { return base + "/v1/sales/" + sale + "/admissions" }
	reservations := atB + "/v1/sales/" + sale + "/reservations"
	reserve := func(base, ticket, key string, q int) edgeAnswer {
		t.Helper()
		return edgeCall(ctx, t, hc, "POST", base+"/v1/sales/"+sale+"/reservations",
			map[string]any{"ticket": ticket, "sku": "phone", "quantity": q, "request_key": key})
	}
	enter := func(base string, i int) string {
		t.Helper()
		en := edgeCall(ctx, t, hc, "POST", admissions(base), map[string]string{"user_id": user(i)})
		if en.code == http.StatusConflict && en.errCode() == "BOUND_ELSEWHERE" {
			t.Fatalf("%s entering at %s: BOUND_ELSEWHERE %v", user(i), base, en.body)
		}
		if (en.code != http.StatusAccepted && en.code != http.StatusCreated) || en.str("admission_id") == "" {
			t.Fatalf("%s entering at %s: %d %v", user(i), base, en.code, en.body)
		}
		return en.str("admission_id")
	}
	pollTicket := func(base string, i int, id string) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			g := edgeCall(ctx, t, hc, "GET", admissions(base)+"/"+id, nil)
			if tk := g.str("ticket"); tk != "" {
				if g.str("state") != "admitted" || g.str("expires_at") == "" {
					t.Fatalf("%s: a ticket in state %q: %v", user(i), g.str("state"), g.body)
				}
				return tk
			}
			if g.code != http.StatusAccepted || time.Now().After(deadline) {
				t.Fatalf("%s's admission %s at %s: %d %v", user(i), id, base, g.code, g.body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	admitStart := time.Now()
	ids := make([]string, buyers)
	for i := range buyers {
		ids[i] = enter(atA, i)
	}
	tickets := make([]string, buyers)
	for i, id := range ids {
		tickets[i] = pollTicket(atA, i, id)
	}
	// Half of them reserve at the leader; the first few pay.
	holds := make([]string, buyers/2)
	for i := range buyers / 2 {
		r := reserve(atA, tickets[i], key(i), 1)
		if r.code != http.StatusCreated || r.str("hold_id") == "" || r.str("user_id") != user(i) || r.str("admission_id") != ids[i] {
			t.Fatalf("%s reserving at region-us: %d %v", user(i), r.code, r.body)
		}
		holds[i] = r.str("hold_id")
	}
	for i := range paying {
		r := edgeCall(ctx, t, hc, "POST", atA+"/v1/holds/"+holds[i]+"/confirm", map[string]string{"payment_id": "pay-" + user(i)})
		if r.code != http.StatusOK || r.str("outcome") != "sold" {
			t.Fatalf("%s paying at region-us: %d %v", user(i), r.code, r.body)
		}
	}
	t.Logf("region-us admitted %d buyers, %d reserved, %d paid, in %s", buyers, buyers/2, paying, time.Since(admitStart).Round(time.Millisecond))

	// A buyer admitted at us is bound to us: eu's edge sends them there (the control for the
	// BOUND_ELSEWHERE checks below).
	{
		en := edgeCall(ctx, t, hc, "POST", admissions(atEU), map[string]string{"user_id": user(0)})
		// Queued, then (eu's room may admit before the binding answers, and withdraw) admitted.
		for deadline := time.Now().Add(10 * time.Second); (en.code == http.StatusAccepted || en.code == http.StatusOK) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			en = edgeCall(ctx, t, hc, "GET", admissions(atEU)+"/"+en.str("admission_id"), nil)
		}
		if en.code != http.StatusConflict || en.errCode() != "BOUND_ELSEWHERE" || en.errStr("region") != "us" {
			t.Fatalf("%s, admitted at us, entering at eu: %d %v, want 409 BOUND_ELSEWHERE naming us", user(0), en.code, en.body)
		}
	}

	// New buyers keep entering at both of us's edges while the leader dies and the standby
	// takes over: bounded in count and time, and stopped before the checks at the end.
	tally := &edgeTally{outcomes: map[string]int{}}
	churnCtx, stopChurn := context.WithTimeout(ctx, churnFor)
	defer stopChurn()
	churnDone := make(chan struct{})
	cc := c.edgeClient("10.2", 3*time.Second)
	go func() {
		defer close(churnDone)
		for i := 0; i < churnN && churnCtx.Err() == nil; i++ {
			node, base := "us", atA
			if i%2 == 1 {
				node, base = "us-2", atB
			}
			a, err := edgeDo(churnCtx, cc, "POST", admissions(base), map[string]string{"user_id": "churn-" + strconv.Itoa(i)})
			switch {
			case churnCtx.Err() != nil:
				return
			case errors.Is(err, syscall.ECONNREFUSED):
				tally.add(node + ": connection refused")
				if node == "us-2" {
					tally.bad("region-us-2 refused a connection")
				}
			case err != nil:
				tally.add(node + ": transport error")
				if node == "us-2" {
					tally.bad(fmt.Sprintf("region-us-2: %v", err))
				}
			default:
				tally.add(strings.TrimSpace(fmt.Sprintf("%s: %d %s", node, a.code, a.errCode())))
				if node == "us-2" && a.code >= 300 && a.errCode() != "NOT_LEADER" {
					tally.bad(fmt.Sprintf("region-us-2 answered %d %v", a.code, a.body))
				}
				if a.errCode() == "BOUND_ELSEWHERE" {
					tally.bad(fmt.Sprintf("region-%s answered BOUND_ELSEWHERE to a new buyer", node))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond) // some new buyers reach the leader before it dies

	// kill -9 of us's leader; until region-us-2 leads, one unused ticket is tried at its edge:
	// 503 NOT_LEADER, then 201.
	killed := time.Now()
	c.cluster(30*time.Second, "kill", "region-us")
	t.Logf("cluster kill region-us: %s", time.Since(killed).Round(time.Millisecond))
	probe := buyers / 2
	var (
		firstReserved time.Duration
		first         edgeAnswer
		probes        int
		notLeader     int
	)
	for deadline := killed.Add(ttl + 15*time.Second); ; {
		probes++
		r, err := edgeDo(ctx, hc, "POST", reservations,
			map[string]any{"ticket": tickets[probe], "sku": "phone", "quantity": 1, "request_key": key(probe)})
		if err != nil {
			t.Fatalf("an unused ticket of region-us at region-us-2, %s after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		if r.code == http.StatusCreated {
			firstReserved = time.Since(killed)
			first = r
			break
		}
		if r.code != http.StatusServiceUnavailable || r.errCode() != "NOT_LEADER" {
			t.Fatalf("an unused ticket of region-us at region-us-2, %s after the kill: %d %v, want 503 NOT_LEADER until it leads, then 201",
				time.Since(killed).Round(time.Millisecond), r.code, r.body)
		}
		notLeader++
		if time.Now().After(deadline) {
			t.Fatalf("region-us-2 reserved no ticket of region-us within %s of the kill (%d probes): %d %v", ttl+15*time.Second, probes, r.code, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("FIRST TICKET: region-us-2 reserved a ticket region-us had signed %s after kill -9 of region-us (lease TTL %s, %d probes, %d NOT_LEADER)",
		firstReserved.Round(time.Millisecond), ttl, probes, notLeader)
	if first.str("user_id") != user(probe) || first.str("admission_id") != ids[probe] || first.str("state") != "held" || first.str("region") != "us" {
		t.Fatalf("the first reservation at region-us-2: %v", first.body)
	}
	if firstReserved > ttl+5*time.Second {
		t.Errorf("the first ticket reserved %s after the kill, want at most the lease TTL + 5s = %s", firstReserved.Round(time.Millisecond), ttl+5*time.Second)
	}
	c.eventually(10*time.Second, "cluster status: region-us-2 leads us", func() error {
		st := c.status()
		if !strings.Contains(st["region-us-2"], "leader") || !strings.HasPrefix(st["region-us"], "stopped") {
			return fmt.Errorf("region-us %q, region-us-2 %q", st["region-us"], st["region-us-2"])
		}
		return nil
	})

	// (1) Every unused ticket region-us signed reserves at region-us-2.
	checkStart := time.Now()
	for i := probe + 1; i < buyers; i++ {
		r := reserve(atB, tickets[i], key(i), 1)
		if r.code != http.StatusCreated || r.str("user_id") != user(i) || r.str("admission_id") != ids[i] || r.str("state") != "held" {
			t.Errorf("unused ticket of %s at region-us-2: %d %v, want 201 held", user(i), r.code, r.body)
		}
	}
	// (2) Every used ticket replays its hold under its key (held, or sold for those who paid),
	// and backs no other key.
	for i := range buyers / 2 {
		want := "held"
		if i < paying {
			want = "sold"
		}
		r := reserve(atB, tickets[i], key(i), 1)
		if r.code != http.StatusOK || r.str("hold_id") != holds[i] || r.body["replayed"] != true || r.str("state") != want {
			t.Errorf("replay of %s's ticket at region-us-2: %d %v, want 200 replaying hold %s (%s)", user(i), r.code, r.body, holds[i], want)
		}
		o := reserve(atB, tickets[i], key(i)+"-again", 1)
		if o.code != http.StatusConflict || o.errCode() != "TICKET_USED" {
			t.Errorf("%s's used ticket under another key at region-us-2: %d %v, want 409 TICKET_USED", user(i), o.code, o.body)
		}
	}
	t.Logf("at region-us-2: %d unused tickets reserved, %d used ones replayed and refused another key, in %s",
		buyers-probe, buyers/2, time.Since(checkStart).Round(time.Millisecond))
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
	t.Logf("%d new buyers entered during the kill: %s", tally.sent, strings.Join(seen, ", "))
	for _, u := range tally.unexpected {
		t.Errorf("during the kill: %s", u)
	}
	if tally.outcomes["us-2: 202"]+tally.outcomes["us-2: 201"] == 0 {
		t.Errorf("no new buyer was let in at region-us-2 during the kill")
	}
	tally.mu.Unlock()

	// (3) The buyers region-us admitted enter again at region-us-2: the failover kept their
	// admission, used (its ticket backs their hold), so they get it back, with no second
	// ticket.
	for i := range buyers {
		en := edgeCall(ctx, t, hc, "POST", admissions(atB), map[string]string{"user_id": user(i)})
		if en.code != http.StatusOK || en.str("admission_id") != ids[i] || en.str("state") != "used" || en.str("ticket") != "" {
			t.Fatalf("%s entering again at region-us-2: %d %v, want 200 used, admission %s, no ticket", user(i), en.code, en.body, ids[i])
		}
	}

	// The per-user limit holds over every stored hold of the region's database.
	perUser, err := c.unitsPerUser(ctx, "us", sale)
	if err != nil {
		t.Fatal(err)
	}
	var units int64
	for u, q := range perUser {
		if q > limit {
			t.Errorf("user %s holds %d units (held + sold) at us, over the per-user limit %d", u, q, limit)
		}
		units += q
	}
	for i := range buyers {
		if perUser[user(i)] != 1 { // the one unit of their one ticket: a failover hands out no second
			t.Errorf("%s holds %d units at us; want 1", user(i), perUser[user(i)])
		}
	}
	if len(perUser) != buyers {
		t.Errorf("%d users hold units at us; want the %d buyers", len(perUser), buyers)
	}

	// The audit: I1 and every region's books, exit 0.
	s := c.auditSale(t, sale)
	if s.Total != total {
		t.Errorf("audit total %d, want %d", s.Total, total)
	}
	if s.Held+s.Sold != units || s.Sold != paying {
		t.Errorf("audit held %d + sold %d, want the %d units the region's database holds, %d of them sold", s.Held, s.Sold, units, paying)
	}
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}

// connectDB connects to the cluster's database named name after its prefix ("coordinator",
// "region_us", ...), as the cluster's superuser URL names it.
func (c *localCluster) connectDB(ctx context.Context, name string) (*pgx.Conn, error) {
	u, err := url.Parse(c.pgURL)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + c.prefix + "_" + name
	return pgx.Connect(ctx, u.String())
}

// unitsPerUser sums the held and sold units of sale per user in region r's database.
func (c *localCluster) unitsPerUser(ctx context.Context, r, sale string) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := c.connectDB(ctx, "region_"+r)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT user_id, sum(quantity)::bigint FROM holds
		WHERE sale_id = $1 AND state IN ('held', 'sold') GROUP BY user_id`, sale)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var user string
	var q int64
	_, err = pgx.ForEachRow(rows, []any{&user, &q}, func() error {
		out[user] = q
		return nil
	})
	return out, err
}
