package local_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/linearize"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// chaos settings: QUOTA_CHAOS_DURATION (nemesis + load), QUOTA_CHAOS_SEED (default: the clock),
// QUOTA_CHAOS_REPORT (a file the CHAOS line is also written to, since `go test ./...` hides the
// output of passing tests).
const (
	chaosSale = "chaos" // phone in us, eu and ap: load, transfers, rebalances
	linSale   = "lin"   // item, all in eu: the pools whose histories are checked; no transfers
	linUnits  = 1000
	linLimit  = 3
	linHolds  = 4 // workers on the pool
	// linEpisode is how long the workers use one pool before moving to a fresh one (sales
	// lin, lin-1, lin-2, ...). Pools are independent objects and linearizability is local, so
	// each pool's history is checked on its own: the checker's memory stays bounded however
	// long the run. chaosUnitsPer is the load's stock per episode, so it does not sell out.
	linEpisode    = 2 * time.Minute
	chaosUnitsPer = 60000
)

// linPool is one episode's pool and the history recorded on it.
type linPool struct {
	sale string
	rec  *linearize.Recorder
}

// episodes is how many pools a run of d uses.
func episodes(d time.Duration) int { return int((d + linEpisode - 1) / linEpisode) }

type chaosRun struct {
	t         *testing.T
	c         *localCluster
	links     *links
	seed      uint64
	duration  time.Duration
	start     time.Time
	pools     []linPool
	workers   []*linWorker
	regions   map[string]*regionClient
	load      loadgen.Stats
	loadErr   error
	nem       *nemesis
	linResult string
	ops       chaosOps
}

// chaosOps counts what the test asked of the coordinators.
type chaosOps struct {
	mu                           sync.Mutex
	transfers, transfersAcked    int
	rebalances, rebalancesAcked  int
	posted, voided, stranded     int
	holdsChecked, linOps, linUnk int
}

func chaosSettings(t *testing.T) (time.Duration, uint64) {
	d := 2 * time.Minute
	if v := os.Getenv("QUOTA_CHAOS_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("QUOTA_CHAOS_DURATION=%q: want a positive duration (%v)", v, err)
		}
	}
	seed := uint64(time.Now().UnixNano() % 1_000_000_000)
	if v := os.Getenv("QUOTA_CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("QUOTA_CHAOS_SEED=%q: %v", v, err)
		}
	}
	return d, seed
}

// TestChaos runs the cluster on real processes with toxiproxy on every region's and
// coordinator's links to PostgreSQL and etcd, a seeded nemesis (kill -9, SIGSTOP past the
// lease, link cuts and latency) and, meanwhile, buyers, transfers and rebalances. Then it heals
// everything and checks: audit ok, I1 exact, nothing oversold, every acknowledged hold at its
// region, every transfer finished or stranded with a reason, and the history of one pool
// linearizable (porcupine).
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: not in -short")
	}
	duration, seed := chaosSettings(t)
	fmt.Printf("CHAOS: seed=%d duration=%s (reproduce: make chaos SEED=%d DURATION=%s)\n", seed, duration, seed, duration)
	t.Logf("seed %d, duration %s", seed, duration)
	r := &chaosRun{t: t, seed: seed, duration: duration, regions: map[string]*regionClient{}}
	for i := range episodes(duration) {
		p := linPool{sale: linSale, rec: linearize.NewRecorder()}
		if i > 0 {
			p.sale = fmt.Sprintf("%s-%d", linSale, i)
		}
		r.pools = append(r.pools, p)
	}
	r.c = newLocalCluster(t, "ch", "QUOTA_CLUSTER_LEASE_TTL=2s")
	u, err := url.Parse(r.c.pgURL)
	if err != nil {
		t.Fatal(err)
	}
	r.links = newLinks(t, r.c, u.Host)
	up := time.Now()
	r.c.cluster(5*time.Minute, "up")
	t.Logf("cluster up: %s", time.Since(up).Round(time.Millisecond))
	r.c.env = append(r.c.env, "QUOTA_CLUSTER_BUILD=0")
	for i, name := range []string{"us", "eu", "ap"} {
		r.regions[name] = newRegionClient(r.c.creds(trust.Storefront), r.c.addr(1+i), r.c.addr(11+i))
		defer r.regions[name].close()
	}
	r.createSales()
	r.start = time.Now()
	r.chaos()
	r.heal()
	r.settle()
	violations := r.check()
	r.report(violations, time.Since(up))
	if !t.Failed() {
		r.c.cluster(2*time.Minute, "down", "--purge")
		r.c.purged = true
	}
}

func (r *chaosRun) createSales() {
	ttl := (r.duration + 20*time.Minute).String()
	sales := [][]string{{"sale", "create", "--sale", chaosSale, "--sku", "phone=" + strconv.Itoa(chaosUnitsPer*len(r.pools)),
		"--per-user-limit", "2", "--hold-ttl", ttl, "--allocate", "us=1,eu=1,ap=1"}}
	for _, p := range r.pools {
		sales = append(sales, []string{"sale", "create", "--sale", p.sale, "--sku", "item=" + strconv.Itoa(linUnits),
			"--per-user-limit", strconv.Itoa(linLimit), "--hold-ttl", ttl, "--allocate", "eu=1"})
	}
	for _, args := range sales {
		if out, err := r.c.quotactl(r.c.addr(0), args...); err != nil {
			r.t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
}

// chaos runs the nemesis, the buyers, the linearizability workers and the transfers for the
// duration, and waits for all of them.
func (r *chaosRun) chaos() {
	ctx, cancel := context.WithTimeout(context.Background(), r.duration)
	defer cancel()
	r.nem = newNemesis(r.t, r.c, r.links, r.seed, r.resolve)
	var wg sync.WaitGroup
	wg.Go(func() { r.nem.run(ctx, r.start) })
	wg.Go(func() { r.transfers(ctx) })
	wg.Go(func() {
		r.load, r.loadErr = loadgen.Run(ctx, loadgen.Config{Sale: chaosSale, SKU: "phone", Creds: r.c.creds(trust.Storefront),
			Regions: []loadgen.Region{{Name: "us", Addr: r.c.addr(1), Weight: 2}, {Name: "eu", Addr: r.c.addr(2), Weight: 1},
				{Name: "ap", Addr: r.c.addr(3), Weight: 1}},
			Buyers: 1_000_000, Concurrency: 4, ConfirmRatio: 0.5, UserPrefix: "ch-", MaxDuration: r.duration, Seed: r.seed,
			Resolve: r.resolve})
	})
	for i := range linHolds {
		w := &linWorker{id: i, rc: r.regions["eu"], pool: &r.pools[0], sku: "item",
			rng: mrand.New(mrand.NewPCG(r.seed, uint64(i)+1)), expect: map[string]quotav1.HoldState{}, counts: map[linearize.Kind]int{}}
		r.workers = append(r.workers, w)
		wg.Go(func() {
			for ctx.Err() == nil {
				if e := min(int(time.Since(r.start)/linEpisode), len(r.pools)-1); w.pool != &r.pools[e] {
					w.pool = &r.pools[e] // a fresh pool; what is pending stays with its own
				}
				w.step(ctx)
				time.Sleep(time.Duration(10+w.rng.IntN(30)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	r.t.Logf("chaos over after %s; nemesis: %v", time.Since(r.start).Round(time.Millisecond), r.nem.counts)
}

// resolve names where a region answers now, asking either coordinator.
func (r *chaosRun) resolve(ctx context.Context, region string) string {
	for _, off := range []int{0, 10} {
		if a := currentRegionAddr(ctx, r.c.creds(trust.Operator), r.c.addr(off), region); a != "" {
			return a
		}
	}
	return ""
}
