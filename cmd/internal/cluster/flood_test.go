package cluster_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// floodRSSBound is the most the region's resident memory may grow while one storefront
// floods it twice (docs/security.md), each time with 20,000 reserves of a buyer at the limit
// and 20,000 reserve and release cycles with fresh keys: the working set of serving the
// flood (buffers, the collector's headroom). floodRSSGrowth is the most the second flood may
// add to the first: what a flood makes the region keep. Without the cap on request keys per
// buyer each flood's cycles grew the leader by about 1.9 KB each, 38 MB.
const (
	floodRSSBound  = 96 << 20
	floodRSSGrowth = 16 << 20
)

// TestStorefrontFloodIsBounded floods one region (a real quotad process) from a storefront
// certificate, twice: a buyer at the per-user limit sends 20,000 reserves with fresh keys,
// and another reserves and releases 20,000 times with a fresh key each time, while other
// buyers make 400 reserves. Every flood call is answered (LIMIT_EXCEEDED, TOO_MANY_KEYS or
// granted), none hangs; the region's resident memory stays within floodRSSBound, the second
// flood adding at most floodRSSGrowth. TestStorefrontFloodLatency measures the other buyers'
// latency under the same floods. Both are measurements of a quotad process (never built
// with -race) under 80,000 calls, so `make test` runs them in a step of their own after
// `go test ./...`, alone on the machine and without -race, with QUOTA_FLOOD=1
// (docs/security.md); without that variable they are skipped.
func TestStorefrontFloodIsBounded(t *testing.T) {
	skipUnlessFloodStep(t)
	p, shop := startFloodRegion(t)
	rss0 := rss(t, p.cmd.Process.Pid)
	counts := map[string]int64{}
	var rss1 int64
	for round := range 2 {
		c, _ := flood(t, shop, round, func(tag string, _ func() bool) []time.Duration { return othersFor(t, shop, tag, 50, timeUp(time.Hour)) })
		addCounts(counts, c)
		if round == 0 {
			rss1 = rss(t, p.cmd.Process.Pid)
		}
	}
	rss2 := rss(t, p.cmd.Process.Pid)
	t.Logf("flood outcomes %v; region RSS %d → %d → %d MiB", counts, rss0>>20, rss1>>20, rss2>>20)
	checkFloodOutcomes(t, counts)
	if rss2-rss0 > floodRSSBound {
		t.Errorf("the region grew by %d MiB under the floods; the bound is %d MiB", (rss2-rss0)>>20, floodRSSBound>>20)
	}
	if rss2-rss1 > floodRSSGrowth {
		t.Errorf("the second flood grew the region by %d MiB more; want at most %d MiB (what a flood makes it keep is bounded)", (rss2-rss1)>>20, floodRSSGrowth>>20)
	}
}

// TestStorefrontFloodLatency runs the floods of TestStorefrontFloodIsBounded while other
// buyers reserve all through them, and in quiet spells before, between and after: their p99
// during the floods stays within twice the quiet spells'. Interleaved spells let a pause of
// the machine's own (a checkpoint, another process) weigh on both sides alike, and each p99
// is over thousands of calls. It is a measurement of the region against itself, so it runs
// alone on the machine, in make test's flood step (QUOTA_FLOOD=1, see
// TestStorefrontFloodIsBounded).
func TestStorefrontFloodLatency(t *testing.T) {
	skipUnlessFloodStep(t)
	_, shop := startFloodRegion(t)
	counts := map[string]int64{}
	othersFor(t, shop, "warm", 50, timeUp(time.Hour)) // connections and plans warm before the first quiet spell
	quiet := othersFor(t, shop, "quiet0", othersMaxCalls, timeUp(quietSpell))
	var during []time.Duration
	for round := range 2 {
		c, lat := flood(t, shop, round, func(tag string, over func() bool) []time.Duration {
			return othersFor(t, shop, tag, othersMaxCalls, over)
		})
		addCounts(counts, c)
		during = append(during, lat...)
		quiet = append(quiet, othersFor(t, shop, "quiet"+strconv.Itoa(round+1), othersMaxCalls, timeUp(quietSpell))...)
	}
	if len(quiet) < 400 || len(during) < 400 {
		t.Fatalf("other buyers made %d calls in the quiet spells and %d during the floods; want at least 400 of each for a p99", len(quiet), len(during))
	}
	q, busy := p99(quiet), p99(during)
	t.Logf("flood outcomes %v; others' latency quiet (%d calls) %s, during the floods (%d calls) %s; p99 ratio %.2f",
		counts, len(quiet), percentiles(quiet), len(during), percentiles(during), float64(busy)/float64(q))
	checkFloodOutcomes(t, counts)
	if busy > 2*q {
		t.Errorf("others' p99 during the floods %s, more than twice the quiet spells' %s", busy, q)
	}
}

// skipUnlessFloodStep skips a flood test unless QUOTA_FLOOD=1: make test's flood step, which
// runs them alone after go test ./... and fails unless both ran and passed.
func skipUnlessFloodStep(t *testing.T) {
	if os.Getenv("QUOTA_FLOOD") != "1" {
		t.Skip("a measurement of a quotad process under floods: run alone with QUOTA_FLOOD=1 (make test's flood step)")
	}
}

// startFloodRegion starts a one-region quotad with a sale of 100,000 phones, a per-user limit
// of 2 and mallory at it, and returns the process and a storefront's client.
func startFloodRegion(t *testing.T) (*quotadProc, quotav1.RegionServiceClient) {
	base := testnet.Base(t, 0, 1, 90, 91)
	prefix := "quota_t_" + randHex(t)
	t.Cleanup(func() { dropDBs(t, prefix, []string{"us"}) })
	p := &quotadProc{t: t, base: base, args: []string{"dev", "--regions", "us", "--base-port", strconv.Itoa(base), "--data-dir", t.TempDir(),
		"--db-prefix", prefix, "--pg-url", testpg.AdminURL(), "--lease-ttl", "2s", "--log-level", "warn", "--certs-dir", certs.Dir()}}
	p.start()
	t.Cleanup(p.kill9)
	ctx := context.Background()
	coord := quotav1.NewCoordinatorServiceClient(dial(t, "127.0.0.1:"+strconv.Itoa(base), trust.Operator))
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "flood", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 100000}},
		PerUserLimit: 2, HoldTtlMs: (10 * time.Minute).Milliseconds()}); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "flood", RequestId: "a", Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	shop := quotav1.NewRegionServiceClient(dial(t, "127.0.0.1:"+strconv.Itoa(base+1), trust.Storefront))
	for _, k := range []string{"a", "b"} { // mallory at the limit
		if _, err := shop.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "flood", Sku: "phone", UserId: "mallory", Quantity: 1, RequestKey: k}); err != nil {
			t.Fatal(err)
		}
	}
	return p, shop
}

// checkFloodOutcomes: two floods were answered only LIMIT_EXCEEDED, TOO_MANY_KEYS or a grant
// (released at once), and both the per-user limit and the cap on keys answered.
func checkFloodOutcomes(t *testing.T, counts map[string]int64) {
	t.Helper()
	for k := range counts {
		if !slices.Contains([]string{"LIMIT_EXCEEDED", "TOO_MANY_KEYS", "granted", "released"}, k) {
			t.Errorf("flood answered %q %d times; want only LIMIT_EXCEEDED, TOO_MANY_KEYS or a grant", k, counts[k])
		}
	}
	if counts["TOO_MANY_KEYS"] == 0 || counts["LIMIT_EXCEEDED"] < 40000 {
		t.Errorf("outcomes %v; want the cap on keys and the per-user limit both to answer", counts)
	}
}

// quietSpell is how long other buyers reserve with no flood, before, between and after the
// floods.
const quietSpell = 2 * time.Second

// flood runs one flood of 40,000 calls from 8 callers (round numbers its keys) while
// others measures other buyers (told when the flood is over), and returns the flood's
// outcomes and the others' latencies.
func flood(t *testing.T, shop quotav1.RegionServiceClient, round int, others func(tag string, over func() bool) []time.Duration) (map[string]int64, []time.Duration) {
	var outcomes sync.Map
	var wg sync.WaitGroup
	var next atomic.Int64
	next.Store(int64(round) * 40000)
	for range 8 { // as many as the other buyers: the flood's client shares the test's two cores
		wg.Go(func() { floodCalls(t, shop, &next, int64(round+1)*40000, &outcomes) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	over := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	time.Sleep(100 * time.Millisecond) // the flood under way
	busy := others("flood"+strconv.Itoa(round), over)
	if over() && len(busy) < 400 {
		t.Errorf("the flood was over before the other buyers made 400 calls (%d): their p99 was not measured under it", len(busy))
	}
	<-done
	counts := map[string]int64{}
	outcomes.Range(func(k, v any) bool { counts[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return counts, busy
}

// addCounts adds the outcomes c to counts.
func addCounts(counts, c map[string]int64) {
	for k, v := range c {
		counts[k] += v
	}
}

// floodCalls sends flood calls numbered from next until n: even numbers a reserve by mallory
// (at the limit), odd ones a reserve by eve, released at once when granted.
func floodCalls(t *testing.T, shop quotav1.RegionServiceClient, next *atomic.Int64, n int64, outcomes *sync.Map) {
	count := func(k string) {
		v, _ := outcomes.LoadOrStore(k, &atomic.Int64{})
		v.(*atomic.Int64).Add(1)
	}
	for i := next.Add(1); i <= n; i = next.Add(1) {
		user := "mallory"
		if i%2 == 1 {
			user = "eve"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := shop.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "flood", Sku: "phone", UserId: user, Quantity: 1, RequestKey: "f" + strconv.FormatInt(i, 10)})
		switch {
		case err == nil:
			count("granted")
			if _, err := shop.Release(ctx, &quotav1.ReleaseRequest{HoldId: res.GetReservation().GetHoldId()}); err == nil {
				count("released")
			} else {
				count("release: " + err.Error())
			}
		case apierr.Reason(err) != "":
			count(apierr.Reason(err))
		default:
			count(err.Error())
		}
		cancel()
	}
}

// timeUp is a stop condition true once d has passed.
func timeUp(d time.Duration) func() bool {
	end := time.Now().Add(d)
	return func() bool { return time.Now().After(end) }
}

// othersMaxCalls bounds each caller's reserves in one spell of othersFor: 8 callers, each
// reserve a unit of the sale's 100,000, over a warm-up, two floods and three quiet spells.
const othersMaxCalls = 1500

// othersFor has 8 buyers reserve (one unit, a new buyer per call) until stop says so, each
// at most calls times, and returns the latencies.
func othersFor(t *testing.T, shop quotav1.RegionServiceClient, tag string, calls int, stop func() bool) []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := 0; i < calls && !stop(); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				_, err := shop.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "flood", Sku: "phone", UserId: fmt.Sprintf("%s-%d-%d", tag, c, i), Quantity: 1, RequestKey: "k"})
				d := time.Since(start)
				cancel()
				if err != nil {
					t.Errorf("%s buyer: %v", tag, err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat
}

// percentiles describes lat: its p50, p90, p99 and maximum.
func percentiles(lat []time.Duration) string {
	lat = slices.Clone(lat)
	slices.Sort(lat)
	n := len(lat)
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, max %s", lat[n/2], lat[n*9/10], lat[n*99/100], lat[n-1])
}

// p99 is the 99th percentile of lat.
func p99(lat []time.Duration) time.Duration {
	lat = slices.Clone(lat)
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// rss is a process's resident memory in bytes, from /proc.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc status")
	return 0
}
