package region_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
)

// BenchmarkArchive measures the archiver: QUOTA_BENCH_HOLDS (default 100,000) holds of one
// sale, each of its own buyer, sold an hour ago (past Config.Sweep.RetainClosed) and still in the
// holds table (as after the migration that added the archive), moved to holds_closed by one
// ArchiveNow through the leader's writer, in batches of 1,024. It reports archived holds per
// second. Run:
//
//	go test -run '^$' -bench BenchmarkArchive -benchtime 1x ./region/
func BenchmarkArchive(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("QUOTA_BENCH_HOLDS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool, _ := testpg.NewPool(b, "archbench", 4)
	if err := region.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	region.StoreBenchHolds(b, pool, n, 0, "sold")
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE holds`); err != nil {
		b.Fatal(err)
	}
	r, err := region.New(region.Config{Name: "us", Sweep: region.SweepConfig{Interval: time.Hour}, Logger: quietLogger}, pool)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	if err := r.Lead(ctx, 1); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	moved, err := r.ArchiveNow(ctx)
	took := time.Since(start)
	b.StopTimer()
	if err != nil || moved != n {
		b.Fatalf("archived %d of %d holds: %v", moved, n, err)
	}
	var left, archived int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM holds), (SELECT count(*) FROM holds_closed)`).Scan(&left, &archived); err != nil || left != 0 || archived != n {
		b.Fatalf("%d holds left in holds, %d archived (%v); want 0 and %d", left, archived, err, n)
	}
	b.ReportMetric(float64(n)/took.Seconds(), "archived/s")
}
