package bench

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/transfer"
)

// redisPath finds redis-server for a test. Without it the test is skipped on a developer's
// machine (scripts/redis-setup.sh installs it) and fails under CI=true, where `make test`
// has installed it.
func redisPath(t *testing.T) string {
	t.Helper()
	p, err := redisServerPath("")
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI: %v", err)
	}
	t.Skipf("%v", err)
	return ""
}

// (g) and (h) for real, at 2 and 8 callers, each on a redis-server the bench starts and
// stops: exact sell-out, no oversell, the users' counts within the limit and adding up to
// the holds, a retry of a taken request replaying its hold (all in Check, read on the
// server), both ratios computed, no server left running and no database created.
func TestRedisVariantsSellExactlyTheStock(t *testing.T) {
	redisPath(t)
	const stock = transfer.Units(150)
	rep, prefix := tinyRun(t, "quota_t_redis_", Config{Concurrencies: []int{2, 8}, Stock: stock,
		Variants: []string{VariantRegion, VariantRedisAlways, VariantRedisEverysec}})
	var got []string
	for _, v := range rep.Variants {
		got = append(got, v.Variant)
		checkVariant(t, v, stock)
		if v.Variant != VariantRegion && (v.Reservations != int64(stock) || v.Errors != 0 || v.ServerCPUPerOp < 0) {
			t.Errorf("(%s@%d): %d taken, %d errors, want %d and 0", v.Variant, v.Concurrency, v.Reservations, v.Errors, stock)
		}
	}
	if want := []string{"d", "g", "h", "d", "g", "h"}; !slices.Equal(got, want) {
		t.Fatalf("variants %v, want %v", got, want)
	}
	for _, name := range []string{"d/g", "d/h"} {
		if r := ratioNamed(t, rep.Ratios, name); r.Value <= 0 {
			t.Errorf("%s = %v, want a ratio", name, r.Value)
		}
	}
	if !strings.HasPrefix(rep.Setup.RedisServer, "Redis server v=") || !strings.Contains(rep.Setup.Placement, "redis-server") {
		t.Errorf("setup: redis %q, placement %q", rep.Setup.RedisServer, rep.Setup.Placement)
	}
	if n := liveRedis.Load(); n != 0 {
		t.Errorf("%d redis-server processes still running after the run", n)
	}
	assertDropped(t, prefix)
}

// startTestRedis starts a server as (g) does, closed when the test ends.
func startTestRedis(t *testing.T, fsync string) *redisServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := startRedis(ctx, redisPath(t), fsync, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The take script on a real server: a new hold, its retry replaying the same hold without
// taking stock, the same key for another SKU a conflict, a second request of the same user
// refused by the limit, and the last unit leaving the next buyer sold out; the books agree.
func TestRedisTakeReplaysAndKeepsTheLimit(t *testing.T) {
	s := startTestRedis(t, "always")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tk, err := newRedisTaker(ctx, s.addr, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	if err := tk.setStock(ctx, 2); err != nil {
		t.Fatal(err)
	}
	first := ""
	for i, tc := range []struct {
		user, key, sku string
		want           int64
		stockAfter     int64
	}{
		{"ann", "k1", benchSKU, takeNew, 1},
		{"ann", "k1", benchSKU, takeReplay, 1},
		{"ann", "k1", "other", takeConflict, 1},
		{"ann", "k2", benchSKU, takeLimit, 1},
		{"bob", "k1", benchSKU, takeNew, 0},
		{"cat", "k1", benchSKU, takeSoldOut, 0},
		{"bob", "k1", benchSKU, takeReplay, 0},
	} {
		code, hold, err := tk.take(ctx, tc.user, tc.key, tc.sku, 1)
		if err != nil || code != tc.want {
			t.Fatalf("step %d: %s %s %s answered %d %q (%v), want %d", i, tc.user, tc.key, tc.sku, code, hold, err, tc.want)
		}
		if i == 0 {
			first = hold
		}
		if i == 1 && hold != first {
			t.Fatalf("the retry replayed hold %q, want %q", hold, first)
		}
		if left, err := tk.client.Get(ctx, tk.keys.stock()).Int64(); err != nil || left != tc.stockAfter {
			t.Fatalf("step %d: stock %d (%v), want %d", i, left, err, tc.stockAfter)
		}
	}
	b, err := tk.books(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.holds != 2 || b.users != 2 || b.userUnits != 2 || b.overLimit != 0 || b.remaining != 0 || len(b.problems(2)) != 0 {
		t.Fatalf("books %+v, want 2 holds of 2 users, none above the limit, nothing left", b)
	}
	if p := tk.checkRetry(ctx, 0); len(p) != 0 {
		t.Fatalf("retry check: %v", p)
	}
	if ttl, err := tk.client.PTTL(ctx, tk.keys.request("ann", "k1")).Result(); err != nil || ttl <= 0 || ttl > redisRequestTTL {
		t.Fatalf("request record TTL %s (%v), want within %s", ttl, err, redisRequestTTL)
	}
	if exp, err := tk.client.ZScore(ctx, tk.keys.expiry(), first).Result(); err != nil ||
		time.Until(time.UnixMilli(int64(exp))) < redisHoldTTL-time.Minute {
		t.Fatalf("hold %s indexed at %v (%v), want about an hour from now", first, exp, err)
	}
}

// Close stops the server and removes its directory, any number of times; the server is
// durable as asked (its append-only file is in the scratch directory while it runs).
func TestRedisServerCloseIsIdempotent(t *testing.T) {
	s := startTestRedis(t, "everysec")
	if _, err := os.Stat(s.dir + "/appendonlydir"); err != nil {
		t.Errorf("no append-only file in the scratch directory: %v", err)
	}
	for range 3 {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-s.exited:
	default:
		t.Fatal("the process was not reaped by Close")
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Fatalf("scratch directory %s still there (%v)", s.dir, err)
	}
	if n := liveRedis.Load(); n != 0 {
		t.Fatalf("%d redis-server processes still running", n)
	}
}

// A server that cannot start is reported with its output, and leaves neither a process nor
// a directory behind.
func TestRedisStartFailureLeavesNothing(t *testing.T) {
	path := redisPath(t)
	before := scratchDirs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := startRedis(ctx, path, "sometimes", 64) // not an appendfsync policy
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("start with a bad appendfsync: %v, want the server's exit", err)
	}
	if n := liveRedis.Load(); n != 0 {
		t.Fatalf("%d redis-server processes still running", n)
	}
	if after := scratchDirs(t); len(after) > len(before) {
		t.Fatalf("scratch directories left: %v (before %v)", after, before)
	}
}

func scratchDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "quota-bench-redis-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// (d)/(g) and (d)/(h) are taken where (d) peaks, against their targets (≥ 1 and ≥ 0.6).
func TestRedisRatiosAtThePeak(t *testing.T) {
	rep := &Report{Variants: []VariantResult{
		sweepResult("d", 256, 16000, 20), sweepResult("g", 256, 20000, 10), sweepResult("h", 256, 30000, 5),
		sweepResult("d", 1024, 20000, 60), sweepResult("g", 1024, 25000, 40), sweepResult("h", 1024, 30000, 30),
	}}
	rep.finish()
	if rep.PeakConcurrency != 1024 {
		t.Fatalf("peak %d, want 1024", rep.PeakConcurrency)
	}
	if g := ratioNamed(t, rep.Ratios, "d/g"); g.Value != 0.8 || g.Target != 1 || g.Met {
		t.Errorf("d/g %+v, want 0.8 against ≥ 1, not met", g)
	}
	if h := ratioNamed(t, rep.Ratios, "d/h"); h.Value != 0.667 || h.Target != 0.6 || !h.Met {
		t.Errorf("d/h %+v, want 0.667 against ≥ 0.6, met", h)
	}
}

// parsePidStat reads utime + stime after the command name, which may hold spaces and ')'.
func TestParsePidStat(t *testing.T) {
	line := "4242 (redis server) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 5 0 100 1000 200"
	if got, ok := parsePidStat(line); !ok || got != 2870*time.Millisecond {
		t.Fatalf("parsePidStat = %s, %v; want 2.87s (287 ticks)", got, ok)
	}
	for _, bad := range []string{"", "4242 (x) S 1 2", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 nope 37"} {
		if _, ok := parsePidStat(bad); ok {
			t.Errorf("parsePidStat(%q) ok, want not", bad)
		}
	}
}

// A run interrupted while (g) runs fails, and still stops its redis-server and removes its
// directory.
func TestRedisRunCanceledLeavesNothing(t *testing.T) {
	redisPath(t)
	before := scratchDirs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	cfg := Config{PGURL: testpg.AdminURL(), DBPrefix: "quota_t_redis_cancel", Concurrency: 4, Stock: 1_000_000,
		Variants: []string{VariantRedisAlways}, Duration: 40 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Progress: func(m string) {
			if strings.HasSuffix(m, "(g) running") {
				go func() { time.Sleep(300 * time.Millisecond); cancel() }()
			}
		}}
	_, err := Run(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("a run canceled during (g): %v, want the cancellation", err)
	}
	t.Log(err)
	if n := liveRedis.Load(); n != 0 {
		t.Fatalf("%d redis-server processes still running after a canceled run", n)
	}
	if after := scratchDirs(t); len(after) > len(before) {
		t.Fatalf("scratch directories left: %v (before %v)", after, before)
	}
}
