package region_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
)

// BenchmarkLeaderMemory measures what a region leader keeps in memory for its live holds:
// QUOTA_BENCH_HOLDS (default 1,000,000) held holds of one sale, each of its own user, loaded
// when the region takes leadership. It reports heap bytes per hold and the process's
// resident memory. Run:
//
//	go test -run '^$' -bench BenchmarkLeaderMemory -benchtime 1x ./region/
func BenchmarkLeaderMemory(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("QUOTA_BENCH_HOLDS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool, _ := testpg.NewPool(b, "membench", 4)
	if err := region.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO sales VALUES ('m', ARRAY['p'], 2, 3600000, now())`,
		`INSERT INTO pools VALUES ('m', 'p', 0, $1, 0, $1, 0)`,
		`INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at)
			SELECT 'us.' || lpad(g::text, 24, '0'), 'm', 'p', 'buyer-' || g, 1, 'checkout-1', md5(g::text), 'held', now(), now() + interval '1 hour'
			FROM generate_series(1, $1) g`,
	} {
		args := []any{}
		if strings.Contains(q, "$1") {
			args = append(args, n)
		}
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			b.Fatal(err)
		}
	}
	before := heapInUse()
	b.ResetTimer()
	r, err := region.New(region.Config{Name: "us", SweepInterval: time.Hour, Logger: quietLogger}, pool)
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
	b.ReportMetric(float64(residentBytes())/(1<<20), "rss-MiB")
	r.Close()
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// residentBytes reads VmRSS from /proc/self/status (0 where there is none).
func residentBytes() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
