package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
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
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "quota_t_bench_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	const stock = transfer.Units(200)
	rep, err := Run(ctx, Config{PGURL: testpg.AdminURL(), DBPrefix: prefix, Concurrency: 8, Stock: stock, Duration: 20 * time.Second,
		Seed: 7, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Progress: func(m string) { t.Log(m) }})
	if err != nil {
		t.Fatal(err)
	}
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

func checkVariant(t *testing.T, v VariantResult, stock transfer.Units) {
	t.Helper()
	if v.Skipped != "" || v.Errors != 0 || v.Oversell != 0 || v.Check != "ok" {
		t.Errorf("(%s): skipped %q, %d errors (first %q), oversell %d, check %s", v.Variant, v.Skipped, v.Errors, v.FirstError, v.Oversell, v.Check)
	}
	if v.MeasuredOps == 0 || v.OpsPerSec <= 0 || v.Latency.P99 <= 0 || v.ProcessCPUPerOp <= 0 {
		t.Errorf("(%s): nothing measured: %+v", v.Variant, v)
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
