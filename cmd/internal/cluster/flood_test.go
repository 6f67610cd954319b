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
// and another reserves and releases 20,000 times with a fresh key each time. Every flood
// call is answered (LIMIT_EXCEEDED, TOO_MANY_KEYS or granted), none hangs; the region's
// resident memory stays within floodRSSBound, the second flood adding at most
// floodRSSGrowth; and, with QUOTA_FLOOD_P99=1 (the test alone on the machine), other buyers'
// p99 stays within 2× of a quiet run.
func TestStorefrontFloodIsBounded(t *testing.T) {
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
	quiet := p99(append(othersLatencies(t, shop, "quiet0"), othersLatencies(t, shop, "quiet1")...))
	rss0 := rss(t, p.cmd.Process.Pid)
	counts := map[string]int64{}
	var during []time.Duration
	var rss1 int64
	for round := range 2 {
		c, lat := flood(t, shop, round)
		for k, v := range c {
			counts[k] += v
		}
		during = append(during, lat...)
		if round == 0 {
			rss1 = rss(t, p.cmd.Process.Pid)
		}
	}
	rss2 := rss(t, p.cmd.Process.Pid)
	busy := p99(during)
	t.Logf("flood outcomes %v; region RSS %d → %d → %d MiB; others' p99 quiet %s, during the floods %s", counts, rss0>>20, rss1>>20, rss2>>20, quiet, busy)
	for k := range counts {
		if !slices.Contains([]string{"LIMIT_EXCEEDED", "TOO_MANY_KEYS", "granted", "released"}, k) {
			t.Errorf("flood answered %q %d times; want only LIMIT_EXCEEDED, TOO_MANY_KEYS or a grant", k, counts[k])
		}
	}
	if counts["TOO_MANY_KEYS"] == 0 || counts["LIMIT_EXCEEDED"] < 40000 {
		t.Errorf("outcomes %v; want the cap on keys and the per-user limit both to answer", counts)
	}
	if rss2-rss0 > floodRSSBound {
		t.Errorf("the region grew by %d MiB under the floods; the bound is %d MiB", (rss2-rss0)>>20, floodRSSBound>>20)
	}
	if rss2-rss1 > floodRSSGrowth {
		t.Errorf("the second flood grew the region by %d MiB more; want at most %d MiB (what a flood makes it keep is bounded)", (rss2-rss1)>>20, floodRSSGrowth>>20)
	}
	// The latency bound is a measurement of this process against the region alone: under
	// `go test ./...` other packages' tests share the machine's cores and skew one run against
	// the other. It is asserted when asked for (QUOTA_FLOOD_P99=1, docs/security.md).
	switch {
	case os.Getenv("QUOTA_FLOOD_P99") != "1":
		t.Logf("others' p99 ratio flood/quiet %.2f (asserted ≤ 2 with QUOTA_FLOOD_P99=1)", float64(busy)/float64(quiet))
	case busy > 2*quiet:
		t.Errorf("others' p99 during the flood %s, more than twice the quiet run's %s", busy, quiet)
	}
}

// flood runs one flood of 40,000 calls from 8 callers (round numbers its keys) while other
// buyers reserve, and returns the flood's outcomes and the others' latencies.
func flood(t *testing.T, shop quotav1.RegionServiceClient, round int) (map[string]int64, []time.Duration) {
	var outcomes sync.Map
	var wg sync.WaitGroup
	var next atomic.Int64
	next.Store(int64(round) * 40000)
	for range 8 { // as many as the other buyers: the flood's client shares the test's two cores
		wg.Go(func() { floodCalls(t, shop, &next, int64(round+1)*40000, &outcomes) })
	}
	time.Sleep(100 * time.Millisecond)                            // the flood under way
	busy := othersLatencies(t, shop, "flood"+strconv.Itoa(round)) // 400 holds, as each quiet run
	if next.Load() >= int64(round+1)*40000 {
		t.Errorf("the flood was over before the other buyers were done: their p99 was not measured under it")
	}
	wg.Wait()
	counts := map[string]int64{}
	outcomes.Range(func(k, v any) bool { counts[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return counts, busy
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

// othersLatencies has 8 buyers reserve 50 times each (one unit, a new buyer per call) and
// returns the latencies.
func othersLatencies(t *testing.T, shop quotav1.RegionServiceClient, tag string) []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := range 50 {
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
