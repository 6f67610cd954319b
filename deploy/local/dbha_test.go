package local_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// dbTTL is the Patroni ttl the database failover test runs with (QUOTA_CLUSTER_DB_TTL).
const dbTTL = 10 * time.Second

// TestLocalRegionDatabaseFailover is one region's database failover on real Patroni and
// PostgreSQL processes, cheap enough for every run: `cluster up --db-ha=us` (one Patroni
// cluster of two nodes; eu, ap and the ledger on the one PostgreSQL server), then kill -9 of
// us's primary node (Patroni and postmaster) while storefronts reserve and pay at us's HTTP
// edge and stock moves from eu into us: every acknowledged hold is there afterwards in its
// state, every transfer ends posted or voided, nothing is oversold, the audit is clean and us
// serves again within twice Patroni's ttl. It takes under 3 minutes.
func TestLocalRegionDatabaseFailover(t *testing.T) {
	started := time.Now()
	c := startDBHA(t, "rdb", "--db-ha=us")
	c.dbFailover(t, "us", 1)
	total := time.Since(started)
	t.Logf("total %s", total.Round(time.Millisecond))
	if total > dbRegionBudget {
		t.Errorf("one region's database failover took %s, want under %s", total.Round(time.Second), dbRegionBudget)
	}
}

// dbRegionBudget bounds TestLocalRegionDatabaseFailover's wall time, `up` included.
const dbRegionBudget = 3 * time.Minute

// TestLocalDatabaseFailover is the database failover on real Patroni and PostgreSQL
// processes (`cluster up --db-ha`, every database on Patroni): kill -9 of region us's primary
// node (Patroni and postmaster) while storefronts reserve and pay at us's HTTP edge; every
// acknowledged hold is there afterwards in its state, nothing is oversold, the audit is clean
// and us serves again within twice Patroni's ttl. The old primary is started again and rejoins
// as the synchronous standby, and a second failover (the other way) passes the same checks.
// Then the ledger's primary is killed during transfers: each ends posted or voided (a stranded
// one is resolved). It runs only with QUOTA_DB_HA=1 (eight PostgreSQL nodes; about 4 minutes;
// `make db-failover`).
func TestLocalDatabaseFailover(t *testing.T) {
	if os.Getenv("QUOTA_DB_HA") != "1" {
		t.Skip("QUOTA_DB_HA=1 (make db-failover) runs the whole database failover on Patroni (deploy/local/cluster up --db-ha)")
	}
	started := time.Now()
	c := startDBHA(t, "db", "--db-ha")
	for round := 1; round <= 2; round++ {
		old := c.dbFailover(t, "us", round)
		c.cluster(2*time.Minute, "start", old)
		c.eventually(60*time.Second, old+" rejoins as the synchronous standby", func() error {
			if st := c.cluster(30*time.Second, "status"); !strings.Contains(lineOf(st, old), "synchronous standby") {
				return fmt.Errorf("status: %s", lineOf(st, old))
			}
			if role, _ := c.databaseRole(t, "us"); !strings.HasPrefix(role, "primary, synchronous standby ") {
				return fmt.Errorf("quotactl status: us's database %q", role)
			}
			return nil
		})
	}
	c.ledgerFailover(t)
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}

// startDBHA runs `cluster up` with the given --db-ha argument (no region standbys; Patroni's
// ttl dbTTL; the nodes' data in a directory of /tmp, which the postgres user can reach, unlike
// t.TempDir) and creates sale d: 100,000 phones, 3 allocations to us and 1 to eu.
func startDBHA(t *testing.T, tag, dbHA string) *localCluster {
	t.Helper()
	dbDir, err := os.MkdirTemp("", "quota-dbha-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dbDir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := os.Chmod(dbDir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := newLocalCluster(t, tag, "QUOTA_CLUSTER_STANDBYS=0", "QUOTA_CLUSTER_DB_DIR="+dbDir,
		"QUOTA_CLUSTER_DB_TTL="+fmt.Sprint(int(dbTTL.Seconds())))
	up := time.Now()
	c.cluster(6*time.Minute, "up", dbHA)
	t.Logf("cluster up %s: %s", dbHA, time.Since(up).Round(time.Millisecond))
	if out, err := c.quotactl(c.addr(0), "sale", "create", "--sale", "d", "--sku", "phone=100000", "--per-user-limit", "2",
		"--hold-ttl", "10m", "--allocate", "us=3,eu=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	return c
}

// lineOf is the line of `cluster status` about process name.
func lineOf(status, name string) string {
	for _, l := range strings.Split(status, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == name {
			return l
		}
	}
	return ""
}

// edgeLoad is storefronts at one region's HTTP edge: each worker reserves one unit for a new
// buyer and pays for every other hold, recording what was acknowledged.
type edgeLoad struct {
	mu        sync.Mutex
	held      map[string]bool // acknowledged hold → confirmed (acknowledged)
	firstOK   time.Time       // the first reservation acknowledged that was sent at or after since
	since     time.Time
	failures  map[string]int
	inflight  int // reservations sent before since and acknowledged after it
	confirmed int
}

func (l *edgeLoad) run(ctx context.Context, hc *http.Client, edge, sale, tag string, worker int) {
	for n := 0; ctx.Err() == nil && n < 100000; n++ {
		sent := time.Now()
		r, err := edgeDo(ctx, hc, "POST", edge+"/v1/sales/"+sale+"/reservations", map[string]any{
			"user_id": fmt.Sprintf("%s-%d-%d", tag, worker, n), "sku": "phone", "quantity": 1, "request_key": "k"})
		l.mu.Lock()
		ok := err == nil && (r.code == 201 || r.code == 200)
		switch {
		case ok:
			l.held[r.str("hold_id")] = false
			if !l.since.IsZero() && sent.After(l.since) && l.firstOK.IsZero() {
				l.firstOK = time.Now()
			}
			if !l.since.IsZero() && !sent.After(l.since) && time.Now().After(l.since) {
				l.inflight++
			}
		case err != nil:
			l.failures["transport"]++
		default:
			l.failures[fmt.Sprintf("%d %s", r.code, r.errCode())]++
		}
		l.mu.Unlock()
		if !ok {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if n%2 == 0 {
			id := r.str("hold_id")
			if c, err := edgeDo(ctx, hc, "POST", edge+"/v1/holds/"+id+"/confirm", map[string]string{"payment_id": "p-" + id}); err == nil && c.code == 200 {
				l.mu.Lock()
				l.held[id] = true
				l.confirmed++
				l.mu.Unlock()
			}
		}
	}
}

// dbFailover kills the primary node of region r's database under load at r's HTTP edge while
// stock moves into r, and checks the holds, the transfers (each posted or voided, a stranded
// one resolved) and the audit; it returns the killed node's name.
func (c *localCluster) dbFailover(t *testing.T, r string, round int) string {
	t.Helper()
	primary := strings.TrimSpace(c.cluster(30*time.Second, "db-primary", r))
	edge := edgeOf(t, c.addr(1))
	hc := c.edgeClient(fmt.Sprintf("10.%d", round), 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	load := &edgeLoad{held: map[string]bool{}, failures: map[string]int{}}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); load.run(ctx, hc, edge, "d", fmt.Sprintf("r%d", round), w) }()
	}
	moves := map[string]int{}
	wg.Add(1)
	go func() { defer wg.Done(); c.moveStockInto(ctx, r, fmt.Sprintf("m%d", round), moves) }()
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(4 * time.Second)
	if role, _ := c.databaseRole(t, r); !strings.HasPrefix(role, "primary, synchronous standby ") {
		t.Errorf("quotactl status before the kill: %s's database %q; want its primary with a synchronous standby", r, role)
	}
	_, opened := c.databaseMetrics(t, edge)
	killed := time.Now()
	c.cluster(30*time.Second, "kill", primary)
	load.mu.Lock()
	load.since = time.Now() // Patroni and the postmaster are gone
	load.mu.Unlock()
	var promoted time.Duration
	c.eventually(2*dbTTL+10*time.Second, "a new primary of "+r, func() error {
		out, err := c.run(10*time.Second, c.script, "db-primary", r)
		if p := strings.TrimSpace(out); err != nil || p == primary {
			return fmt.Errorf("db-primary %s: %q %v", r, p, err)
		}
		promoted = time.Since(killed)
		return nil
	})
	c.eventually(2*dbTTL+10*time.Second, "a reservation served after the kill", func() error {
		load.mu.Lock()
		defer load.mu.Unlock()
		if load.firstOK.IsZero() {
			return fmt.Errorf("none yet; failures %v", load.failures)
		}
		return nil
	})
	served := load.firstOK.Sub(killed)
	c.eventually(30*time.Second, r+"'s metrics: its database up again, reached by new connections", func() error {
		if up, now := c.databaseMetrics(t, edge); up != 1 || now <= opened {
			return fmt.Errorf("quota_database_up %v, quota_database_connections_opened_total %v (before the kill %v)", up, now, opened)
		}
		return nil
	})
	time.Sleep(3 * time.Second) // served by the new primary for a while
	cancel()
	wg.Wait()
	t.Logf("DB FAILOVER %d: kill -9 %s; promotion seen %s after, first reservation served %s after (ttl %s); %d holds acknowledged (%d confirmed), %d sent before the kill acknowledged after it; refusals %v",
		round, primary, promoted.Round(time.Millisecond), served.Round(time.Millisecond), dbTTL, len(load.held), load.confirmed, load.inflight, load.failures)
	if served > 2*dbTTL {
		t.Errorf("region %s served again %s after the kill, want within twice the ttl (%s)", r, served, 2*dbTTL)
	}
	c.eventually(30*time.Second, "quotactl status: "+r+"'s new primary without a synchronous standby, flagged", func() error {
		role, problems := c.databaseRole(t, r)
		if role != "primary, no synchronous standby" || !strings.Contains(strings.Join(problems, "\n"), "region "+r+": database: the primary has no synchronous standby") {
			return fmt.Errorf("database %q, problems %q", role, problems)
		}
		return nil
	})
	t.Logf("stock moved into %s during the failover, by answer: %v", r, moves)
	c.checkHolds(t, hc, edge, load.held)
	c.settleTransfers(t, "d")
	c.auditSale(t, "d")
	return primary
}

// moveStockInto moves one unit from eu into region r every half second until ctx ends (at
// most 240 moves), as the rebalancer moves stock into a region running dry: the same fenced
// transfers, whose outcomes it counts in answers (the caller reads it once ctx ended and the
// goroutine returned).
func (c *localCluster) moveStockInto(ctx context.Context, r, tag string, answers map[string]int) {
	for n := 0; ctx.Err() == nil && n < 240; n++ {
		out, err := c.quotactl(c.addr(0), "transfer", "--sale", "d", "--sku", "phone", "--from", "eu", "--to", r, "--units", "1",
			"--request-key", fmt.Sprintf("%s-%d", tag, n), "-o", "json")
		switch {
		case err != nil:
			answers["error"]++
		case strings.Contains(out, `"posted"`):
			answers["posted"]++
		default:
			answers["not posted"]++
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// checkHolds reads every acknowledged hold at the edge: there, held or sold, sold if its
// confirm was acknowledged.
func (c *localCluster) checkHolds(t *testing.T, hc *http.Client, edge string, held map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var bad []string
	for id, confirmed := range held {
		a, err := edgeDo(ctx, hc, "GET", edge+"/v1/holds/"+id, nil)
		st := a.str("state")
		if err != nil || a.code != 200 || (st != "held" && st != "sold") || (confirmed && st != "sold") {
			bad = append(bad, fmt.Sprintf("%s (confirmed %v): %d %s %v", id, confirmed, a.code, st, err))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d of %d acknowledged holds missing or in the wrong state, for instance %q", len(bad), len(held), bad[:min(5, len(bad))])
	}
}

// ledgerFailover kills the ledger's primary node while transfers run between us and eu: each
// transfer ends posted or voided (a stranded one once resolved), and the audit is clean.
func (c *localCluster) ledgerFailover(t *testing.T) {
	t.Helper()
	coord := c.addr(0)
	primary := strings.TrimSpace(c.cluster(30*time.Second, "db-primary", "ledger"))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers = map[string]int{}
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ctx.Err() == nil && n < 500; n++ {
			from, to := "us", "eu"
			if n%2 == 1 {
				from, to = to, from
			}
			out, err := c.quotactl(coord, "transfer", "--sale", "d", "--sku", "phone", "--from", from, "--to", to, "--units", "1",
				"--request-key", fmt.Sprintf("lt-%d", n), "-o", "json")
			mu.Lock()
			if err != nil {
				answers["error"]++
			} else {
				answers[map[bool]string{true: "posted", false: "not posted"}[strings.Contains(out, `"posted"`)]]++
			}
			mu.Unlock()
		}
	}()
	time.Sleep(3 * time.Second)
	killed := time.Now()
	c.cluster(30*time.Second, "kill", primary)
	c.eventually(2*dbTTL+10*time.Second, "a transfer posted after the ledger's primary died", func() error {
		out, err := c.quotactl(coord, "transfer", "--sale", "d", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1", "-o", "json")
		if err != nil || !strings.Contains(out, `"posted"`) {
			return fmt.Errorf("%v %s", err, out)
		}
		return nil
	})
	t.Logf("LEDGER FAILOVER: kill -9 %s; a transfer posted %s after", primary, time.Since(killed).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	cancel()
	wg.Wait()
	t.Logf("transfer answers during the run: %v", answers)
	c.settleTransfers(t, "d")
	c.auditSale(t, "d")
}

// transferList is what the test reads of `quotactl transfers list -o json`.
type transferList struct {
	Transfers []struct {
		ID       string `json:"transfer_id"`
		State    string `json:"state"`
		Stranded bool   `json:"stranded"`
	} `json:"transfers"`
}

// settleTransfers waits until every transfer of sale is posted or voided, resolving the
// stranded ones.
func (c *localCluster) settleTransfers(t *testing.T, sale string) {
	t.Helper()
	c.eventually(90*time.Second, "every transfer posted or voided", func() error {
		out, err := c.quotactl(c.addr(0), "transfers", "list", "--sale", sale, "-o", "json")
		var l transferList
		if err != nil || json.Unmarshal([]byte(out), &l) != nil {
			return fmt.Errorf("transfers list: %v %s", err, out)
		}
		open := map[string]int{}
		for _, tr := range l.Transfers {
			if tr.State == "posted" || tr.State == "voided" {
				continue
			}
			open[tr.State]++
			if tr.Stranded {
				if out, err := c.quotactl(c.addr(0), "transfers", "resolve", tr.ID); err != nil {
					t.Logf("transfers resolve %s: %v %s", tr.ID, err, out)
				}
			}
		}
		if len(open) > 0 {
			return fmt.Errorf("unfinished of %d: %v", len(l.Transfers), open)
		}
		t.Logf("%d transfers, every one posted or voided", len(l.Transfers))
		return nil
	})
}

// databaseMetrics scrapes the region leader's /metrics at its edge (as an operator) and
// answers quota_database_up and quota_database_connections_opened_total (-1 when missing).
func (c *localCluster) databaseMetrics(t *testing.T, edge string) (up, opened float64) {
	t.Helper()
	hc := c.as(t).operatorClient()
	defer hc.CloseIdleConnections()
	up, opened = -1, -1
	for _, l := range metricLines(hc, edge) {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		switch name := f[0][:strings.IndexAny(f[0]+"{", "{")]; {
		case err != nil:
		case name == "quota_database_up":
			up = v
		case name == "quota_database_connections_opened_total":
			opened = v
		}
	}
	return up, opened
}

// databaseRole is region r's database role as `quotactl status -o json` reports it, and the
// status's problems (its exit status is 1 with any: this cluster runs no region standbys).
func (c *localCluster) databaseRole(t *testing.T, r string) (string, []string) {
	t.Helper()
	out, _ := c.quotactl(c.addr(0), "status", "-o", "json")
	var st struct {
		Regions []struct {
			Name     string `json:"name"`
			Database string `json:"database"`
		} `json:"regions"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("quotactl status -o json: %v\n%s", err, out)
	}
	for _, reg := range st.Regions {
		if reg.Name == r {
			return reg.Database, st.Problems
		}
	}
	return "", st.Problems
}
