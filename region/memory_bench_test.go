package region_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
	"golang.org/x/sync/errgroup"
)

// BenchmarkLeaderMemory measures what a region leader keeps in memory for its live holds:
// QUOTA_BENCH_HOLDS (default 1,000,000) held holds of one sale, each of its own user, loaded
// when the region takes leadership, under the servers' collector setting (gcconf.Default).
// It reports heap bytes per hold and the process's resident memory after the load; then the
// leader serves QUOTA_BENCH_CHURN (default 100,000) reservations, each released again, from
// 64 callers, and it reports the resident memory after that and the process's peak
// (VmHWM, the load included). Run:
//
//	go test -run '^$' -bench BenchmarkLeaderMemory -benchtime 1x ./region/
func BenchmarkLeaderMemory(b *testing.B) { leaderMemory(b, "held") }

// BenchmarkLeaderMemoryClosed is BenchmarkLeaderMemory with every stored hold sold an hour
// before, longer than Config.Sweep.RetainClosed: a leader keeps of each only its user's count and a
// digest of its key (archive.go), so the heap per hold is a small fraction of a live one's.
func BenchmarkLeaderMemoryClosed(b *testing.B) { leaderMemory(b, "sold") }

// leaderMemory stores QUOTA_BENCH_HOLDS holds (default 1,000,000) of one sale in the given
// state, makes a region lead over them and reports its heap, resident memory and load time,
// then again after QUOTA_BENCH_CHURN (default 100,000) reserves, each released once granted.
func leaderMemory(b *testing.B, state string) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("QUOTA_BENCH_HOLDS")); err == nil && v > 0 {
		n = v
	}
	churn := 100_000
	if v, err := strconv.Atoi(os.Getenv("QUOTA_BENCH_CHURN")); err == nil && v >= 0 {
		churn = v
	}
	defer gcconf.Apply(gcconf.Apply(gcconf.Default()))
	ctx := context.Background()
	pool, _ := testpg.NewPool(b, "membench", 4)
	if err := region.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	region.StoreBenchHolds(b, pool, n, churn, state)
	before := heapInUse()
	b.ResetTimer()
	r, err := region.New(region.Config{Name: "us", Sweep: region.SweepConfig{Interval: time.Hour}, Logger: quietLogger}, pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Lead(ctx, 1); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	after := heapInUse()
	b.ReportMetric(float64(after-before)/float64(n), "heap-bytes/hold")
	b.ReportMetric(float64(after-before)/(1<<20), "heap-MiB")
	b.ReportMetric(float64(residentBytes("VmRSS:"))/(1<<20), "rss-MiB")
	if err := reserveAndRelease(ctx, r, churn, 64); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(residentBytes("VmRSS:"))/(1<<20), "rss-after-churn-MiB")
	b.ReportMetric(float64(residentBytes("VmHWM:"))/(1<<20), "peak-rss-MiB")
	r.Close()
}

// reserveAndRelease makes n reservations of one unit from callers goroutines, releasing each
// right after it is granted.
func reserveAndRelease(ctx context.Context, r *region.Region, n, callers int) error {
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range callers {
		g.Go(func() error {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				res, err := r.Reserve(ctx, region.ReserveRequest{Sale: "m", SKU: "p", User: fmt.Sprintf("churn-%d", i), Quantity: 1, RequestKey: "k"})
				if err != nil {
					return fmt.Errorf("reserve %d: %w", i, err)
				}
				if _, err := r.Release(ctx, res.Hold.ID); err != nil {
					return fmt.Errorf("release %d: %w", i, err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// residentBytes reads a field (VmRSS:, VmHWM:) of /proc/self/status (0 where there is none).
func residentBytes(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
