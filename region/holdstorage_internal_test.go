package region

// The holds table's storage: ids that follow the clock, and keys in byte order (migration 5)
// with the holds written before it intact.

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/transfer"
)

// TestHoldIDsFollowTheClock: a later hold's id sorts after an earlier one's (so a batch's
// inserts meet at the right edge of the primary key), ids minted in the same millisecond
// still differ, and every id is a valid identifier of its region.
func TestHoldIDsFollowTheClock(t *testing.T) {
	c := clock.NewManual(time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC))
	r := &Region{cfg: Config{Name: "eu-west", Clock: c}}
	seen := map[string]bool{}
	prev := ""
	for i := 0; i < 200; i++ {
		id := newHoldID(&r.cfg)
		if why := transfer.CheckID(id); why != "" {
			t.Fatalf("id %q: %s", id, why)
		}
		if !strings.HasPrefix(id, "eu-west.") || len(id) != len("eu-west.")+28 {
			t.Fatalf("id %q: want eu-west. and 28 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("id %q minted twice", id)
		}
		seen[id] = true
		if i%10 == 0 { // ten ids per millisecond, then the clock moves on
			if id <= prev {
				t.Fatalf("id %q minted after %q sorts before it", id, prev)
			}
			prev = id
			c.Advance(time.Millisecond)
		}
	}
}

// TestUpgradeKeepsHolds: a hold written before migration 5 (keys in the database's default
// collation) is loaded after it: the same request with the same key replays the hold, another
// request with that key is refused; the keys are then in byte order, and migrating down
// gives the default collation back.
func TestUpgradeKeepsHolds(t *testing.T) {
	ctx := context.Background()
	pool, _ := testpg.NewPool(t, "upgrade", 4)
	p, done, err := migrator(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if _, err := p.UpTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	for _, q := range []string{
		`INSERT INTO sales VALUES ('s', ARRAY['x'], 10, 3600000, '2030-01-01T00:00:00Z')`,
		`INSERT INTO pools VALUES ('s', 'x', 8, 2, 0, 10, 0)`,
		// The fingerprint of SKU x, quantity 2, as the code before the migration stored it.
		`INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at)
			VALUES ('us.0123456789abcdef01234567', 's', 'x', 'ann', 2, 'k1', '84a4bab7f4d481b33c346895b1fc3bbb', 'held',
			'2030-01-02T11:59:00Z', '2030-01-02T12:59:00Z')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if got := holdKeyCollation(t, ctx, pool); got != "C" {
		t.Fatalf("holds.user_id collation after the migration: %q, want C", got)
	}
	r, err := New(Config{Name: "us", Clock: clock.NewManual(now), Sweep: SweepConfig{Interval: time.Hour}, Logger: slog.New(slog.DiscardHandler)}, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close) // stepping down twice is a no-op
	if err := r.Lead(ctx, 1); err != nil {
		t.Fatal(err)
	}
	got, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 2, RequestKey: "k1"})
	if err != nil || !got.Replayed || got.Hold.ID != "us.0123456789abcdef01234567" {
		t.Fatalf("replay after the upgrade: %+v, %v; want the stored hold, replayed", got, err)
	}
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 1, RequestKey: "k1"}); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("key reused for another request after the upgrade: %v, want ErrAlreadyExists", err)
	}
	r.Close()
	if _, err := p.DownTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if got := holdKeyCollation(t, ctx, pool); got != "" {
		t.Fatalf("holds.user_id collation after migrating down: %q, want the default", got)
	}
}

// holdKeyCollation is holds.user_id's own collation ("" for the database's default).
func holdKeyCollation(t *testing.T, ctx context.Context, pool *pgxpool.Pool) string {
	t.Helper()
	var c *string
	err := pool.QueryRow(ctx, `SELECT collation_name FROM information_schema.columns
		WHERE table_name = 'holds' AND column_name = 'user_id'`).Scan(&c)
	if err != nil {
		t.Fatal(err)
	}
	if c == nil {
		return ""
	}
	return *c
}

// TestMigrationSevenRebuildsAnInvalidIndex: an index holds_by_change that a concurrent build
// left invalid (here a unique build that met duplicates, as a killed build would leave one)
// is dropped and built again by migration 7, not taken for done.
func TestMigrationSevenRebuildsAnInvalidIndex(t *testing.T) {
	ctx := context.Background()
	pool, _ := testpg.NewPool(t, "invalidindex", 4)
	p, done, err := migrator(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at)
			SELECT 'us.' || g, 's', 'x', 'u' || g, 1, 'k', md5(''), 'held', now(), now() FROM generate_series(1, 2) g`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY holds_by_change ON holds (sale_id)`); err == nil {
		t.Fatal("a unique index over duplicates was built")
	}
	indexDef := func() (def string, valid bool) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT pg_get_indexdef(indexrelid), indisvalid FROM pg_index WHERE indexrelid = to_regclass('holds_by_change')`).Scan(&def, &valid)
		if err != nil {
			t.Fatal(err)
		}
		return def, valid
	}
	if _, valid := indexDef(); valid {
		t.Fatal("the failed build left a valid index")
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if def, valid := indexDef(); !valid || !strings.Contains(def, "(changed)") || strings.Contains(def, "UNIQUE") {
		t.Fatalf("after migration 7: %q, valid %v; want a valid index on (changed)", def, valid)
	}
}
