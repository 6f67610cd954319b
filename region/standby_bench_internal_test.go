package region

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/quotaworks/quota/internal/testpg"
	"golang.org/x/sync/errgroup"
)

// BenchmarkTakeover times a region's takeover over QUOTA_BENCH_HOLDS (default 1,000,000) held
// holds of one sale, each of its own user, after the old leader served QUOTA_BENCH_CHURN
// (default 10,000) reservations (every other one paid, the rest released) since the standby's
// last refresh: once by a warm standby (KeepWarm's copy, caught up at takeover) and once by
// a cold one (StandbyRefresh negative: it loads every hold), on the same database, each with
// no other region's state left in the process. Lead is timed from the call to serving, the
// epoch fence included. Run:
//
//	go test -run '^$' -bench BenchmarkTakeover -benchtime 1x ./region/
func BenchmarkTakeover(b *testing.B) {
	n, churn := benchEnv("QUOTA_BENCH_HOLDS", 1_000_000), benchEnv("QUOTA_BENCH_CHURN", 10_000)
	defer gcconf.Apply(gcconf.Apply(gcconf.Default()))
	ctx := context.Background()
	pool, _ := testpg.NewPool(b, "takeoverbench", 8)
	if err := Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	StoreBenchHolds(b, pool, n, churn, "held")
	quiet := slog.New(slog.DiscardHandler)
	newRegion := func(refresh time.Duration) *Region {
		r, err := New(Config{Name: "us", Sweep: SweepConfig{Interval: time.Hour}, Logger: quiet, StandbyRefresh: refresh}, pool)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(r.Close)
		return r
	}
	old, warm, cold := newRegion(0), newRegion(0), newRegion(-1)
	if err := old.Lead(ctx, 1); err != nil {
		b.Fatal(err)
	}
	warm.refreshWarm(ctx)
	if err := churnHolds(ctx, old, churn); err != nil {
		b.Fatal(err)
	}
	release := func(r *Region) { // so the next takeover's collections do not mark it
		r.Close()
		r.state.Store(nil)
		runtime.GC()
	}
	release(old)
	b.ResetTimer()
	for _, c := range []struct {
		name  string
		r     *Region
		epoch int64
	}{{"warm", warm, 2}, {"cold", cold, 3}} {
		start := time.Now()
		if err := c.r.Lead(ctx, c.epoch); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), c.name+"-takeover-s")
		if got := len(c.r.state.Load().holds); got < n {
			b.Fatalf("%s takeover: %d holds in memory, want at least %d", c.name, got, n)
		}
		release(c.r)
	}
	if warm.stats.warmTakeovers.Load() != 1 || cold.stats.fullTakeovers.Load() != 1 {
		b.Fatalf("takeovers: warm standby %d warm, cold standby %d full; want 1 and 1", warm.stats.warmTakeovers.Load(), cold.stats.fullTakeovers.Load())
	}
}

// churnHolds makes r serve n reservations from 64 callers, each of a new user, and pays for
// every other one and releases the rest.
func churnHolds(ctx context.Context, r *Region, n int) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i := range n {
		g.Go(func() error {
			res, err := r.Reserve(gctx, ReserveRequest{Sale: "m", SKU: "p", User: fmt.Sprint("churn-", i), Quantity: 1, RequestKey: "k"})
			if err != nil {
				return err
			}
			if i%2 == 0 {
				_, err = r.Confirm(gctx, res.Hold.ID, fmt.Sprint("pay-", i))
			} else {
				_, err = r.Release(gctx, res.Hold.ID)
			}
			return err
		})
	}
	return g.Wait()
}

// benchEnv reads a positive count from the environment, or gives def.
func benchEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
