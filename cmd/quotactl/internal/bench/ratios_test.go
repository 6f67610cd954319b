package bench

import (
	"fmt"
	"strings"
	"testing"

	"github.com/quotaworks/quota/transfer"
)

// sweepResult is one synthetic variant run: rate is reservations/s for (b)–(d), calls/s for
// (e) and (f).
func sweepResult(variant string, n int, rate, p99 float64) VariantResult {
	v := VariantResult{Variant: variant, Concurrency: n, Round: 1, OpsPerSec: rate}
	v.Latency.P99 = p99
	if variant != VariantNoop && variant != VariantSoldOut {
		v.ReservationsPerSec = rate
	}
	if strings.HasPrefix(variant, "c") {
		fmt.Sscanf(variant, "c%d", &v.Buckets)
	}
	return v
}

func ratioNamed(t *testing.T, rs []Ratio, name string) Ratio {
	t.Helper()
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no ratio %s in %+v", name, rs)
	return Ratio{}
}

// A sweep takes the ratios where (d) peaks, every variant at that same concurrency, and keeps
// every concurrency's own ratios too.
func TestSweepTakesRatiosWhereDPeaks(t *testing.T) {
	rep := &Report{Variants: []VariantResult{
		sweepResult("b", 64, 1500, 200), sweepResult("c16", 64, 5000, 80), sweepResult("d", 64, 20000, 10),
		sweepResult("e", 64, 60000, 5), sweepResult("f", 64, 50000, 5),
		sweepResult("b", 1024, 1400, 900), sweepResult("c16", 1024, 5500, 300), sweepResult("d", 1024, 36000, 100),
		sweepResult("e", 1024, 56000, 60), sweepResult("f", 1024, 52000, 60),
	}}
	rep.finish()
	if rep.PeakConcurrency != 1024 {
		t.Fatalf("peak concurrency %d, want 1024, where (d) is fastest", rep.PeakConcurrency)
	}
	for _, tc := range []struct {
		name string
		want float64
	}{
		{"d/b", 25.714},        // 36,000 over (b)'s 1,400 at 1,024, not its 1,500 at 64
		{"d/best_c", 6.545},    // over (c)'s 5,500 at 1,024
		{"d/e", 0.643},         // over (e)'s 56,000 at 1,024, not its 60,000 at 64
		{"p99_d/p99_e", 1.667}, // 100 ms over (e)'s 60 at 1,024, not its 5 at 64
		{"f/e", 0.929},
	} {
		if got := ratioNamed(t, rep.Ratios, tc.name); got.Value != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got.Value, tc.want)
		}
	}
	if len(rep.AtConcurrency) != 2 || rep.AtConcurrency[0].Concurrency != 64 || rep.AtConcurrency[1].Concurrency != 1024 {
		t.Fatalf("at each concurrency: %+v", rep.AtConcurrency)
	}
	if got := ratioNamed(t, rep.AtConcurrency[0].Ratios, "d/e"); got.Value != 0.333 || got.Met {
		t.Errorf("d/e at 64 callers = %+v, want 0.333, not met", got)
	}
	if got := ratioNamed(t, rep.AtConcurrency[1].Ratios, "p99_d/p99_e"); got.Value != 1.667 || !got.Met {
		t.Errorf("p99 ratio at 1,024 callers = %+v, want 1.667, met", got)
	}
}

// At one concurrency nothing changes: no peak, no per-concurrency list.
func TestOneConcurrencyHasNoPeaks(t *testing.T) {
	rep := &Report{Variants: []VariantResult{sweepResult("d", 64, 20000, 10), sweepResult("e", 64, 60000, 5)}}
	rep.finish()
	if rep.PeakConcurrency != 0 || rep.AtConcurrency != nil {
		t.Errorf("peak concurrency %d, at each %v; want neither", rep.PeakConcurrency, rep.AtConcurrency)
	}
	if got := ratioNamed(t, rep.Ratios, "d/e"); got.Value != 0.333 {
		t.Errorf("d/e = %v", got.Value)
	}
}

func TestConcurrenciesAreChecked(t *testing.T) {
	for _, tc := range []struct {
		ns       []int
		sqlConns int
		want     string
	}{
		{[]int{64, 0}, 0, "concurrency 0: must be 1..10000"},
		{[]int{64, 20000}, 0, "concurrency 20000: must be 1..10000"},
		{[]int{64, 256, 64}, 0, "concurrency 64: given twice"},
		{[]int{128, 16}, 64, "sql conns 64: must be 1..concurrency (16)"},
	} {
		cfg := Config{PGURL: "postgres://x@127.0.0.1/y", Concurrencies: tc.ns, SQLConns: tc.sqlConns, Stock: transfer.Units(10)}
		if err := cfg.Validate(); err == nil || err.Error() != tc.want {
			t.Errorf("concurrencies %v: %v, want %q", tc.ns, err, tc.want)
		}
	}
}

// A real sweep runs every variant at every concurrency, in databases of its own, and drops
// them all.
func TestSweepRunsEveryVariantAtEachConcurrency(t *testing.T) {
	const stock = transfer.Units(100)
	rep, prefix := tinyRun(t, "quota_t_sweep_", Config{Concurrencies: []int{2, 8}, Stock: stock, Variants: []string{"b", "d", "e"}})
	var got []string
	for _, v := range rep.Variants {
		got = append(got, fmt.Sprintf("%s@%d", v.Variant, v.Concurrency))
		checkVariant(t, v, stock)
	}
	if want := "[b@2 d@2 e@2 b@8 d@8 e@8]"; fmt.Sprint(got) != want {
		t.Fatalf("variants %v, want %s", got, want)
	}
	if len(rep.AtConcurrency) != 2 || len(rep.Ratios) != 3 || (rep.PeakConcurrency != 2 && rep.PeakConcurrency != 8) {
		t.Errorf("at each %+v, peak %d, ratios %+v", rep.AtConcurrency, rep.PeakConcurrency, rep.Ratios)
	}
	assertDropped(t, prefix)
}

// A prefix that fits one run can be too long for a sweep with rounds: the longest name must
// fit PostgreSQL's 63 bytes, and the error says how long the prefix may be.
func TestSweepDatabaseNamesFit(t *testing.T) {
	prefix := "p" + strings.Repeat("x", 39) // 40 characters, the most the pattern allows
	one := Config{PGURL: "postgres://x@127.0.0.1/y", DBPrefix: prefix, Stock: 10}
	if err := one.Validate(); err != nil {
		t.Fatalf("one concurrency, one round: %v", err)
	}
	sweep := Config{PGURL: "postgres://x@127.0.0.1/y", DBPrefix: prefix, Stock: 10, Concurrencies: []int{64, 10000}, Rounds: 20}
	err := sweep.Validate()
	if want := "at most 37 characters"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a 40-character prefix with _n10000_r20: %v, want an error saying %q", err, want)
	}
}

// A sweep sizes (a)–(c)'s pool for each concurrency unless --sql-conns was given.
func TestSweepSizesTheSQLPoolPerConcurrency(t *testing.T) {
	cfg := Config{PGURL: "postgres://x@127.0.0.1/y", Stock: 10, Concurrencies: []int{8, 256}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !cfg.sqlConnsDefault || !cfg.setup().SQLConnsPerRun {
		t.Errorf("default pool: per concurrency %v / %v, want true", cfg.sqlConnsDefault, cfg.setup().SQLConnsPerRun)
	}
	given := Config{PGURL: "postgres://x@127.0.0.1/y", Stock: 10, Concurrencies: []int{8, 256}, SQLConns: 4}
	if err := given.Validate(); err != nil || given.sqlConnsDefault {
		t.Errorf("given pool: %v, per concurrency %v; want 4 everywhere", err, given.sqlConnsDefault)
	}
}

// The metrics' cost is (d) over (i), met at 0.95 or more.
func TestMetricsCostRatio(t *testing.T) {
	for _, tc := range []struct {
		d, i float64
		met  bool
	}{{19000, 20000, true}, {18000, 20000, false}} {
		rep := &Report{Variants: []VariantResult{sweepResult("d", 64, tc.d, 10), sweepResult("i", 64, tc.i, 10)}}
		rep.finish()
		if got := ratioNamed(t, rep.Ratios, "d/i"); got.Met != tc.met || got.Target != 0.95 {
			t.Errorf("d %v, i %v: d/i %+v; want met %v", tc.d, tc.i, got, tc.met)
		}
	}
}

// The binding's cost is (d) beside (j), with no target; none without (j).
func TestBindingCost(t *testing.T) {
	rep := &Report{Variants: []VariantResult{sweepResult("d", 64, 15000, 10), sweepResult("j", 64, 20000, 8)}}
	rep.finish()
	b := rep.Binding
	if b == nil || b.Ratio != 0.75 || b.PerSecD != 15000 || b.PerSecJ != 20000 || b.Concurrency != 64 || b.P99D != 10 || b.P99J != 8 {
		t.Fatalf("binding cost %+v; want d/j 0.75 at 64 callers, 15000 and 20000 reservations/s, p99 10 and 8", b)
	}
	for _, r := range rep.Ratios {
		if r.Name == "d/j" {
			t.Fatalf("a ratio with a target for the binding: %+v", r)
		}
	}
	alone := &Report{Variants: []VariantResult{sweepResult("d", 64, 15000, 10)}}
	if alone.finish(); alone.Binding != nil {
		t.Fatalf("binding cost without (j): %+v", alone.Binding)
	}
}
