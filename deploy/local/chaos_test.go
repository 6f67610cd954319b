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
	"github.com/quotaworks/quota/internal/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// chaos settings: QUOTA_CHAOS_DURATION (nemesis + load), QUOTA_CHAOS_SEED (default: the clock),
// QUOTA_CHAOS_REPORT (a file the CHAOS line is also written to, since `go test ./...` hides the
// output of passing tests).
const (
	chaosSale = "chaos" // phone in us, eu and ap: load, transfers, rebalances
	linSale   = "lin"   // item, all in eu: the pool whose history is checked; no transfers
	linUnits  = 1000
	linLimit  = 3
	linHolds  = 4 // workers on the pool
)

type chaosRun struct {
	t         *testing.T
	c         *localCluster
	links     *links
	seed      uint64
	duration  time.Duration
	start     time.Time
	rec       *linearize.Recorder
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
	r := &chaosRun{t: t, seed: seed, duration: duration, rec: linearize.NewRecorder(), regions: map[string]*regionClient{}}
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
		r.regions[name] = newRegionClient(r.c.addr(1+i), r.c.addr(11+i))
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
	for _, args := range [][]string{
		{"sale", "create", "--sale", chaosSale, "--sku", "phone=60000", "--per-user-limit", "2", "--hold-ttl", ttl, "--allocate", "us=1,eu=1,ap=1"},
		{"sale", "create", "--sale", linSale, "--sku", "item=" + strconv.Itoa(linUnits), "--per-user-limit", strconv.Itoa(linLimit),
			"--hold-ttl", ttl, "--allocate", "eu=1"},
	} {
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
		r.load, r.loadErr = loadgen.Run(ctx, loadgen.Config{Sale: chaosSale, SKU: "phone",
			Regions: []loadgen.Region{{Name: "us", Addr: r.c.addr(1), Weight: 2}, {Name: "eu", Addr: r.c.addr(2), Weight: 1},
				{Name: "ap", Addr: r.c.addr(3), Weight: 1}},
			Buyers: 1_000_000, Concurrency: 4, ConfirmRatio: 0.5, UserPrefix: "ch-", MaxDuration: r.duration, Seed: r.seed,
			Resolve: r.resolve})
	})
	for i := range linHolds {
		w := &linWorker{id: i, rc: r.regions["eu"], rec: r.rec, sale: linSale, sku: "item",
			rng: mrand.New(mrand.NewPCG(r.seed, uint64(i)+1)), expect: map[string]quotav1.HoldState{}, counts: map[linearize.Kind]int{}}
		r.workers = append(r.workers, w)
		wg.Go(func() {
			for ctx.Err() == nil {
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
		if a := currentRegionAddr(ctx, r.c.addr(off), region); a != "" {
			return a
		}
	}
	return ""
}
