package region

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/transfer"
)

// memHolds lists which of ids the leader keeps whole in memory.
func memHolds(r *Region, ids ...string) map[string]bool {
	m := r.state.Load()
	m.mu.RLock()
	defer m.mu.RUnlock()
	in := map[string]bool{}
	for _, id := range ids {
		in[id] = m.holds[id] != nil
	}
	return in
}

// mustReserveIn reserves q of sale s, SKU x for user under key and fails the test unless a
// new hold is granted.
func mustReserveIn(t *testing.T, r *Region, ctx context.Context, user, key string, q transfer.Units) Hold {
	t.Helper()
	res, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: user, Quantity: q, RequestKey: key})
	if err != nil || res.Replayed {
		t.Fatalf("reserve %s/%s: %+v, %v", user, key, res, err)
	}
	return res.Hold
}

// TestClosedHoldsLeaveMemoryAfterRetention: a closed hold stays whole in the leader's memory
// for RetainClosed after it closed, then only its key's digest stays; its replays, confirms
// and releases are then answered from SQL exactly as before.
func TestClosedHoldsLeaveMemoryAfterRetention(t *testing.T) {
	r, ctx := newInternalRegion(t) // RetainClosed: the default, 10m
	clk := r.cfg.Clock.(*clock.Manual)
	sold, released, live := mustReserveIn(t, r, ctx, "ann", "k1", 1), mustReserveIn(t, r, ctx, "bob", "k1", 1), mustReserveIn(t, r, ctx, "cat", "k1", 1)
	if res, err := r.Confirm(ctx, sold.ID, "pay-1"); err != nil || !res.Sold {
		t.Fatalf("confirm: %+v, %v", res, err)
	}
	if _, err := r.Release(ctx, released.ID); err != nil {
		t.Fatal(err)
	}
	clk.Advance(DefaultRetainClosed - time.Second)
	mustReserveIn(t, r, ctx, "dan", "k1", 1) // a commit: retirement runs after each
	if in := memHolds(r, sold.ID, released.ID, live.ID); !in[sold.ID] || !in[released.ID] || !in[live.ID] {
		t.Fatalf("before the retention ended: in memory %v, want all", in)
	}
	clk.Advance(2 * time.Second)
	mustReserveIn(t, r, ctx, "eve", "k1", 1)
	if in := memHolds(r, sold.ID, released.ID, live.ID); in[sold.ID] || in[released.ID] || !in[live.ID] {
		t.Fatalf("after the retention: in memory %v, want only %s", in, live.ID)
	}
	checkRetiredAnswers(t, r, ctx, sold, released)
}

// TestRetiredKeyLookedUpBeforeTheWriter: a retry of a retired hold's key is looked up in SQL
// before the writer, since the committed state says the key may be a retired hold's
// (memState.lookupFor): it is answered while the writer is busy, without going through it.
func TestRetiredKeyLookedUpBeforeTheWriter(t *testing.T) {
	r, ctx := newInternalRegion(t) // 10 units of s/x; RetainClosed: the default, 10m
	h := mustReserveIn(t, r, ctx, "ann", "k1", 1)
	if _, err := r.Release(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	r.cfg.Clock.(*clock.Manual).Advance(DefaultRetainClosed + time.Second)
	mustReserveIn(t, r, ctx, "bob", "k1", 1) // a commit: the released hold retires
	if memHolds(r, h.ID)[h.ID] {
		t.Fatal("the released hold is still whole in memory")
	}
	busy := blockOp{make(chan struct{})}
	t.Cleanup(func() { close(busy.ch) })
	go submitOp[any](ctx, r.leadership, busy)
	for len(r.w.in) != 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the writer is inside busy
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := r.Reserve(rctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 1, RequestKey: "k1"})
	if err != nil || !res.Replayed || res.Hold.ID != h.ID || res.Hold.State != Released {
		t.Fatalf("retry of a retired hold's key while the writer is busy: %+v, %v; want the released hold replayed", res, err)
	}
}

// checkRetiredAnswers asks about two retired holds, one sold to pay-1 and one released, and
// checks every answer is what it was while they were in memory.
func checkRetiredAnswers(t *testing.T, r *Region, ctx context.Context, sold, released Hold) {
	t.Helper()
	res, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: sold.User, Quantity: sold.Quantity, RequestKey: sold.RequestKey})
	if err != nil || !res.Replayed || res.Hold.ID != sold.ID || res.Hold.State != Sold || res.Hold.PaymentID != "pay-1" {
		t.Errorf("replay of a retired hold: %+v, %v", res, err)
	}
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: sold.User, Quantity: sold.Quantity + 1, RequestKey: sold.RequestKey}); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("a retired hold's key reused for another request: %v, want ErrAlreadyExists", err)
	}
	if c, err := r.Confirm(ctx, sold.ID, "pay-1"); err != nil || !c.Sold || c.Hold.State != Sold {
		t.Errorf("confirm again with the same payment: %+v, %v", c, err)
	}
	if c, err := r.Confirm(ctx, sold.ID, "pay-2"); err != nil || c.Sold || c.Reason == "" {
		t.Errorf("confirm with another payment: %+v, %v; want a refund", c, err)
	}
	if _, err := r.Release(ctx, sold.ID); !errors.Is(err, ErrConflict) {
		t.Errorf("release of a retired sold hold: %v, want ErrConflict", err)
	}
	if h, err := r.Release(ctx, released.ID); err != nil || h.State != Released {
		t.Errorf("release again: %+v, %v", h, err)
	}
	if c, err := r.Confirm(ctx, released.ID, "pay-3"); err != nil || c.Sold {
		t.Errorf("confirm of a retired released hold: %+v, %v; want a refund", c, err)
	}
	var late int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM late_payments`).Scan(&late); err != nil || late != 2 {
		t.Errorf("%d late payments recorded (%v), want 2 (pay-2, pay-3)", late, err)
	}
	if _, err := r.Confirm(ctx, "us.0000000000000000000000000000", "pay-4"); !errors.Is(err, ErrNotFound) {
		t.Errorf("confirm of a hold that never was: %v, want ErrNotFound", err)
	}
}

// closeAndTakeOver makes, in a fresh region, a hold sold (ann, 6 units), one released (bob)
// and one live (ann, 1 unit), lets the clock run for idle, and hands the region to a new
// leader, which it returns with the three holds.
func closeAndTakeOver(t *testing.T, idle time.Duration) (r *Region, ctx context.Context, sold, released, live Hold) {
	old, ctx := newInternalRegion(t) // limit 10 per user, 10 units
	if _, err := old.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t2", Sale: "s", SKU: "x", Units: 10}); err != nil {
		t.Fatal(err)
	}
	sold, released = mustReserveIn(t, old, ctx, "ann", "k1", 6), mustReserveIn(t, old, ctx, "bob", "k1", 1)
	live = mustReserveIn(t, old, ctx, "ann", "k2", 1)
	if _, err := old.Confirm(ctx, sold.ID, "pay-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Release(ctx, released.ID); err != nil {
		t.Fatal(err)
	}
	old.cfg.Clock.(*clock.Manual).Advance(idle)
	return takeOverFrom(t, old, 2), ctx, sold, released, live
}

// takeOverFrom closes old and returns a new leader of its region at epoch, on its clock.
func takeOverFrom(t *testing.T, old *Region, epoch int64) *Region {
	old.Close()
	r, err := New(Config{Name: "us", Clock: old.cfg.Clock, Sweep: SweepConfig{Interval: time.Hour}, Logger: slog.New(slog.DiscardHandler)}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Lead(context.Background(), epoch); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestLoadedHoldClosedAheadOfTheClock: a hold whose stored closed_at is ahead of the new
// leader's clock (the old leader's clock ran fast) does not hold up the retiring of the holds
// the new leader closes after it.
func TestLoadedHoldClosedAheadOfTheClock(t *testing.T) {
	old, ctx := newInternalRegion(t)
	early, late := mustReserveIn(t, old, ctx, "ann", "k1", 1), mustReserveIn(t, old, ctx, "bob", "k1", 1)
	if _, err := old.Release(ctx, early.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := old.pool.Exec(ctx, `UPDATE holds SET closed_at = closed_at + interval '1 hour' WHERE hold_id = $1`, early.ID); err != nil {
		t.Fatal(err)
	}
	r := takeOverFrom(t, old, 2)
	if _, err := r.Release(ctx, late.ID); err != nil {
		t.Fatal(err)
	}
	r.cfg.Clock.(*clock.Manual).Advance(DefaultRetainClosed + time.Second)
	mustReserveIn(t, r, ctx, "cat", "k1", 1) // a commit: retirement runs after each
	if in := memHolds(r, early.ID, late.ID); in[early.ID] || in[late.ID] {
		t.Fatalf("after the retention: in memory %v, want neither", in)
	}
	for _, h := range []Hold{early, late} {
		if got, err := r.Release(ctx, h.ID); err != nil || got.State != Released {
			t.Errorf("release again of retired %s: %+v, %v", h.ID, got, err)
		}
	}
}

// TestTakeoverLoadsOnlyLiveHolds: a new leader, loading after the closed holds' retention
// ended, keeps the live holds whole and only the keys' digests of closed ones, and still
// counts what each user bought (I2).
func TestTakeoverLoadsOnlyLiveHolds(t *testing.T) {
	r, ctx, sold, released, live := closeAndTakeOver(t, DefaultRetainClosed+time.Second)
	m := r.state.Load()
	if len(m.holds) != 1 || m.holds[live.ID] == nil || int(m.retired.added) != 2 || len(m.closing) != 0 {
		t.Fatalf("after takeover: %d holds in memory (want only %s), %d retired (want 2), %d queued to retire (want 0)",
			len(m.holds), live.ID, int(m.retired.added), len(m.closing))
	}
	// ann has 6 bought and 1 held of a limit of 10.
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 4, RequestKey: "k3"}); !errors.Is(err, ErrLimitExceeded) {
		t.Errorf("ann over her limit after takeover: %v, want ErrLimitExceeded", err)
	}
	checkRetiredAnswers(t, r, ctx, sold, released)
	// With the pool empty, a retry is answered without the writer, from SQL.
	mustReserveIn(t, r, ctx, "zed", "k1", 10)
	mustReserveIn(t, r, ctx, "yan", "k1", 3)
	res, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: sold.User, Quantity: sold.Quantity, RequestKey: sold.RequestKey})
	if err != nil || !res.Replayed || res.Hold.ID != sold.ID || res.Hold.State != Sold {
		t.Errorf("replay of a retired hold, pool empty: %+v, %v", res, err)
	}
}

// TestTakeoverKeepsRecentlyClosedHolds: a leader that loads within the retention keeps the
// recently closed holds whole, queued to retire when their retention, counted from their
// stored closed_at, ends; until then their retries are answered from memory.
func TestTakeoverKeepsRecentlyClosedHolds(t *testing.T) {
	r, ctx, sold, released, live := closeAndTakeOver(t, DefaultRetainClosed/2)
	m := r.state.Load()
	if in := memHolds(r, sold.ID, released.ID, live.ID); !in[sold.ID] || !in[released.ID] || !in[live.ID] || int(m.retired.added) != 0 || len(m.closing) != 2 {
		t.Fatalf("after takeover: in memory %v (want all), %d retired (want 0), %d queued (want 2)", in, int(m.retired.added), len(m.closing))
	}
	checkRetiredAnswers(t, r, ctx, sold, released) // answered from memory, and a commit
	r.cfg.Clock.(*clock.Manual).Advance(DefaultRetainClosed / 2)
	mustReserveIn(t, r, ctx, "cat", "k1", 1) // the first commit after the retention ended
	if in := memHolds(r, sold.ID, released.ID, live.ID); in[sold.ID] || in[released.ID] || !in[live.ID] {
		t.Fatalf("after the retention: in memory %v, want only %s", in, live.ID)
	}
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 4, RequestKey: "k3"}); !errors.Is(err, ErrLimitExceeded) {
		t.Errorf("ann over her limit after takeover: %v, want ErrLimitExceeded", err)
	}
}

// TestRetiredDigestCollision: a new key whose digest matches a retired one is looked up in SQL,
// found to be new, and granted.
func TestRetiredDigestCollision(t *testing.T) {
	r, ctx := newInternalRegion(t)
	m := r.state.Load()
	k := keyKey{"s", "ann", "never-used"}
	m.mu.Lock()
	m.retired.add(m.keyDigest(k)) // as if a retired hold's key hashed the same
	m.mu.Unlock()
	h := mustReserveIn(t, r, ctx, "ann", "never-used", 1)
	res, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 1, RequestKey: "never-used"})
	if err != nil || !res.Replayed || res.Hold.ID != h.ID {
		t.Errorf("retry: %+v, %v; want the hold granted first", res, err)
	}
	// The same on the empty-pool path, which answers without the writer.
	mustReserveIn(t, r, ctx, "zed", "k1", 9) // the last 9 of 10 units
	k = keyKey{"s", "bob", "never-used"}
	m.mu.Lock()
	m.retired.add(m.keyDigest(k))
	m.mu.Unlock()
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "bob", Quantity: 1, RequestKey: "never-used"}); !errors.Is(err, ErrRegionExhausted) {
		t.Errorf("a new key colliding with a retired one, pool empty: %v, want ErrRegionExhausted", err)
	}
	if res, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 1, RequestKey: "never-used"}); err != nil || !res.Replayed || res.Hold.ID != h.ID {
		t.Errorf("retry with the pool empty: %+v, %v; want the hold granted first", res, err)
	}
}

// TestHeldInSQLButNotInMemoryFailsTheBatch: a hold the database has as held but memory does
// not (a newer leader made it, or memory is wrong) is never decided from SQL: the batch fails,
// the leader reloads, and then the hold is decided from memory.
func TestHeldInSQLButNotInMemoryFailsTheBatch(t *testing.T) {
	r, ctx := newInternalRegion(t)
	h := mustReserveIn(t, r, ctx, "ann", "k1", 1)
	m := r.state.Load()
	m.mu.Lock()
	delete(m.holds, h.ID) // memory loses a live hold
	m.mu.Unlock()
	if c, err := r.Confirm(ctx, h.ID, "pay-1"); !errors.Is(err, ErrAborted) {
		t.Fatalf("confirm of a hold memory lost: %+v, %v; want ErrAborted (the batch failed, nothing changed)", c, err)
	}
	if c, err := r.Confirm(ctx, h.ID, "pay-1"); err != nil || !c.Sold {
		t.Fatalf("confirm after the reload: %+v, %v", c, err)
	}
}

// TestBadStoredFingerprint: a stored request fingerprint that is not 32 hex digits is an
// error naming the hold wherever the leader reads it, not a value taken as some other
// fingerprint: a takeover's load fails, and so does a retry of a retired hold's key, which
// changes nothing (the leader goes on leading: the retry reads SQL outside the writer).
func TestBadStoredFingerprint(t *testing.T) {
	for _, bad := range []string{"abc", "zz" + strings.Repeat("0", 30), strings.Repeat("0", 34)} {
		t.Run("load "+bad, func(t *testing.T) {
			old, ctx := newInternalRegion(t)
			h := mustReserveIn(t, old, ctx, "ann", "k1", 1)
			old.Close()
			if _, err := old.pool.Exec(ctx, `UPDATE holds SET request_hash = $2 WHERE hold_id = $1`, h.ID, bad); err != nil {
				t.Fatal(err)
			}
			r, err := New(Config{Name: "us", Clock: old.cfg.Clock, Sweep: SweepConfig{Interval: time.Hour}, Logger: slog.New(slog.DiscardHandler)}, old.pool)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Close)
			if err := r.Lead(ctx, 2); err == nil || !strings.Contains(err.Error(), h.ID) || !strings.Contains(err.Error(), "request_hash") {
				t.Fatalf("takeover over a bad fingerprint: %v, want an error naming hold %s and request_hash", err, h.ID)
			}
		})
		t.Run("retired "+bad, func(t *testing.T) {
			r, ctx := newInternalRegion(t)
			h := mustReserveIn(t, r, ctx, "ann", "k1", 1)
			if _, err := r.Release(ctx, h.ID); err != nil {
				t.Fatal(err)
			}
			r.cfg.Clock.(*clock.Manual).Advance(DefaultRetainClosed + time.Second)
			mustReserveIn(t, r, ctx, "bob", "k1", 1) // a commit: retirement runs after each
			if in := memHolds(r, h.ID); in[h.ID] {
				t.Fatal("the released hold is still in memory")
			}
			if _, err := r.pool.Exec(ctx, `UPDATE holds SET request_hash = $2 WHERE hold_id = $1`, h.ID, bad); err != nil {
				t.Fatal(err)
			}
			pools := func() (row [3]int64) {
				t.Helper()
				if err := r.pool.QueryRow(ctx, `SELECT available, held, sold FROM pools WHERE sale_id = 's' AND sku = 'x'`).Scan(&row[0], &row[1], &row[2]); err != nil {
					t.Fatal(err)
				}
				return row
			}
			before := pools()
			_, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 1, RequestKey: "k1"})
			if err == nil || !strings.Contains(err.Error(), h.ID) || !strings.Contains(err.Error(), "request_hash") {
				t.Fatalf("retry of a retired key with a bad fingerprint: %v, want an error naming hold %s and request_hash", err, h.ID)
			}
			if after := pools(); after != before || !r.Leading() {
				t.Fatalf("stock %+v after the failed retry, %+v before; leading %v", after, before, r.Leading())
			}
		})
	}
}
