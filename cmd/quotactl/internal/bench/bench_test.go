package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/transfer"
)

// TestEveryVariantSellsExactlyTheStock runs the whole bench at tiny scale against the real
// PostgreSQL: every stock variant sells exactly its stock and never more (by its answers
// and by the rows in its database), the sold-out region answers only REGION_EXHAUSTED, the
// ratios are computed, and every database the run created is gone afterwards.
func TestEveryVariantSellsExactlyTheStock(t *testing.T) {
	const stock = transfer.Units(200)
	rep, prefix := tinyRun(t, "quota_t_bench_", Config{Concurrency: 8, Stock: stock})
	want := []string{"a", "b", "c4", "c16", "c64", "d", "e", "f"}
	if len(rep.Variants) != len(want) {
		t.Fatalf("got %d variants, want %v", len(rep.Variants), want)
	}
	for i, v := range rep.Variants {
		if v.Variant != want[i] {
			t.Fatalf("variant %d is %q, want %q", i, v.Variant, want[i])
		}
		checkVariant(t, v, stock)
	}
	if rep.BestBuckets == 0 || len(rep.Ratios) != 5 {
		t.Fatalf("best K %d, ratios %+v; want a best K and 5 ratios", rep.BestBuckets, rep.Ratios)
	}
	assertDropped(t, prefix)
}

// tinyRun runs the bench as cfg says against the test PostgreSQL, in databases named after
// base and a random suffix (returned), with a 20 s cap per variant and seed 7.
func tinyRun(t *testing.T, base string, cfg Config) (*Report, string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	cfg.PGURL, cfg.DBPrefix, cfg.Duration, cfg.Seed = testpg.AdminURL(), base+hex.EncodeToString(b[:]), 20*time.Second, 7
	cfg.Logger, cfg.Progress = slog.New(slog.NewTextHandler(io.Discard, nil)), func(m string) { t.Log(m) }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep, cfg.DBPrefix
}

func checkVariant(t *testing.T, v VariantResult, stock transfer.Units) {
	t.Helper()
	if v.Skipped != "" || v.Errors != 0 || v.Oversell != 0 || v.Check != "ok" {
		t.Errorf("(%s): skipped %q, %d errors (first %q), oversell %d, check %s", v.Variant, v.Skipped, v.Errors, v.FirstError, v.Oversell, v.Check)
	}
	if v.MeasuredOps == 0 || v.OpsPerSec <= 0 || v.Latency.P99 <= 0 || v.ProcessCPUPerOp <= 0 {
		t.Errorf("(%s): nothing measured: %+v", v.Variant, v)
	}
	if v.MachineBusyPct < 0 || v.MachineBusyPct > 100 || v.MachineCPUPerOp < 0 {
		t.Errorf("(%s): machine %v %% busy, %v µs/op", v.Variant, v.MachineBusyPct, v.MachineCPUPerOp)
	}
	switch v.Variant {
	case VariantNoop:
		if v.Ops != 5*int64(stock) {
			t.Errorf("(e): %d calls, want %d", v.Ops, 5*stock)
		}
	case VariantSoldOut:
		if v.Ops != 5*int64(stock) || v.Refusals != v.Ops || v.Reservations != 0 || v.HoldRows != 0 {
			t.Errorf("(f): %d calls, %d REGION_EXHAUSTED, %d reserved, %d new holds; want every call REGION_EXHAUSTED",
				v.Ops, v.Refusals, v.Reservations, v.HoldRows)
		}
	default:
		if v.Sold != stock || v.HoldRows != int64(stock) || v.Remaining != 0 || v.EndedBy != "sold out" {
			t.Errorf("(%s): sold %d, %d hold rows, %d remaining, ended by %q; want exactly %d sold", v.Variant, v.Sold, v.HoldRows,
				v.Remaining, v.EndedBy, stock)
		}
	}
}

func assertDropped(t *testing.T, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testpg.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)`, prefix).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d databases named %s* left behind", left, prefix)
	}
}

// With rounds, every variant runs once per round, in databases of its own, and the ratios
// come from each variant's medians.
func TestRoundsRunEveryVariantEachRound(t *testing.T) {
	const stock = transfer.Units(100)
	rep, prefix := tinyRun(t, "quota_t_rounds_", Config{Concurrency: 4, Stock: stock, Variants: []string{"b", "d", "e"}, Rounds: 2})
	var got []string
	for _, v := range rep.Variants {
		got = append(got, fmt.Sprintf("%s/%d", v.Variant, v.Round))
		checkVariant(t, v, stock)
	}
	if want := "[b/1 d/1 e/1 b/2 d/2 e/2]"; fmt.Sprint(got) != want {
		t.Fatalf("variants %v, want %s", got, want)
	}
	d := []float64{rep.Variants[1].ReservationsPerSec, rep.Variants[4].ReservationsPerSec}
	e := []float64{rep.Variants[2].OpsPerSec, rep.Variants[5].OpsPerSec}
	want := math.Round((d[0]+d[1])/(e[0]+e[1])*1000) / 1000 // the median of two is their mean
	for _, r := range rep.Ratios {
		if r.Name == "d/e" && r.Value != want {
			t.Errorf("d/e = %v, want %v from the medians", r.Value, want)
		}
	}
	if rep.Setup.Rounds != 2 || len(rep.Ratios) != 3 {
		t.Errorf("setup rounds %d, ratios %+v; want 2 rounds and d/b, d/e, p99", rep.Setup.Rounds, rep.Ratios)
	}
	assertDropped(t, prefix)
}

// (d) and (j) each sell exactly the stock, each on a cluster of its own, in the reverse
// order in even rounds, and the binding's cost is reported beside them.
func TestBindingVariantRunsBesideD(t *testing.T) {
	const stock = transfer.Units(100)
	rep, prefix := tinyRun(t, "quota_t_bind_", Config{Concurrency: 4, Stock: stock, Variants: []string{"j", "d"}, Rounds: 2})
	var got []string
	for _, v := range rep.Variants {
		got = append(got, fmt.Sprintf("%s/%d", v.Variant, v.Round))
		checkVariant(t, v, stock)
	}
	if want := "[d/1 j/1 j/2 d/2]"; fmt.Sprint(got) != want {
		t.Fatalf("variants %v, want %s", got, want)
	}
	if b := rep.Binding; b == nil || b.PerSecD <= 0 || b.PerSecJ <= 0 || b.Ratio <= 0 {
		t.Fatalf("binding cost %+v; want both rates and their ratio", b)
	}
	assertDropped(t, prefix)
}

func TestMedianOf(t *testing.T) {
	rs := func(xs ...float64) []VariantResult {
		var out []VariantResult
		for _, x := range xs {
			out = append(out, VariantResult{OpsPerSec: x})
		}
		return out
	}
	ops := func(v VariantResult) float64 { return v.OpsPerSec }
	for _, tc := range []struct {
		in   []VariantResult
		want float64
	}{{rs(5), 5}, {rs(3, 1, 2), 2}, {rs(4, 1, 3, 2), 2.5}} {
		if got := medianOf(tc.in, ops); got != tc.want {
			t.Errorf("medianOf(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
