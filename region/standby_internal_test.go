package region

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/clock"
	"golang.org/x/sync/errgroup"
)

// newStandby starts a region process on old's database and clock that does not lead, and
// loads its warm copy.
func newStandby(t *testing.T, old *Region) *Region {
	t.Helper()
	sb, err := New(Config{Name: "us", Clock: old.cfg.Clock, Sweep: SweepConfig{Interval: time.Hour}, Logger: slog.New(slog.DiscardHandler)}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Close)
	sb.refreshWarm(context.Background())
	if sb.warm == nil {
		t.Fatal("the standby has no warm copy after a refresh")
	}
	return sb
}

// TestWarmStandbyCatchesUpExactly: a standby refreshed between rounds of reserves, payments,
// releases and expiries (holds made and closed between two refreshes among them), some
// rounds past the retention of closed holds, takes over from its copy, and the copy equals
// what a full load of the same snapshot gives: pools, holds, keys, users' counts, live
// deadlines, the queue of closed holds to retire and the retired keys. The new leader then
// serves from it with the books balanced.
func TestWarmStandbyCatchesUpExactly(t *testing.T) {
	old, ctx := newInternalRegion(t)
	clk := old.cfg.Clock.(*clock.Manual)
	if _, err := old.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t2", Sale: "s", SKU: "x", Units: 5000}); err != nil {
		t.Fatal(err)
	}
	var valid bool
	if err := old.pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'holds_by_change'::regclass`).Scan(&valid); err != nil || !valid {
		t.Fatalf("index holds_by_change: valid %v, %v", valid, err)
	}
	sb := newStandby(t, old)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []Hold
	for round := range 12 {
		for i := range 40 {
			h := mustReserveIn(t, old, ctx, fmt.Sprintf("u%02d", rng.IntN(60)), fmt.Sprintf("r%d-%d", round, i), 1)
			live = append(live, h)
		}
		rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
		for len(live) > 30 { // some held holds stay across rounds; the rest close now
			h := live[len(live)-1]
			live = live[:len(live)-1]
			var err error
			if rng.IntN(2) == 0 {
				_, err = old.Confirm(ctx, h.ID, "pay-"+h.ID)
			} else {
				_, err = old.Release(ctx, h.ID)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		switch round % 4 {
		case 1: // the holds reserved a minute ago and still held expire
			clk.Advance(2 * time.Minute)
			if _, err := old.SweepNow(ctx); err != nil {
				t.Fatal(err)
			}
			live = live[:0]
		case 3: // what closed so far is past the retention, on both sides
			clk.Advance(DefaultRetainClosed)
		}
		if round%3 != 2 { // some rounds are caught up only at the next refresh
			sb.refreshWarm(ctx)
		}
	}
	old.Close()
	full, err := loadMem(ctx, old.pool, "us", clk.Now(), DefaultRetainClosed)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Lead(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if w, f := sb.stats.warmTakeovers.Load(), sb.stats.fullTakeovers.Load(); w != 1 || f != 0 {
		t.Fatalf("takeovers: %d warm, %d full; want the warm copy used", w, f)
	}
	if err := sameCaughtUp(ctx, sb.state.Load(), full, sb, clk.Now(), clk.Now().Add(-DefaultRetainClosed)); err != nil {
		t.Fatal(err)
	}
	if int(full.retired.added) == 0 {
		t.Fatal("no hold closed past the retention: the test no longer covers retiring")
	}
	mustReserveIn(t, sb, ctx, "new", "k", 1)
	if err := checkPoolBooks(ctx, sb); err != nil {
		t.Fatal(err)
	}
}

// TestKeepWarmFollowsTheLeader: a standby refreshing every 5 ms on its own goroutine
// (KeepWarm) while 16 callers reserve, pay and release at the leader takes over from its copy
// when the leader stops, and its memory equals a full load's; once it steps down, it loads a
// copy again and takes over from that one too, after a third process led in between; and
// KeepWarm's goroutine ends with its context (goleak checks the package).
func TestKeepWarmFollowsTheLeader(t *testing.T) {
	old, ctx := newInternalRegion(t)
	clk := old.cfg.Clock.(*clock.Manual)
	if _, err := old.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t2", Sale: "s", SKU: "x", Units: 100000}); err != nil {
		t.Fatal(err)
	}
	sb, err := New(Config{Name: "us", Clock: clk, Sweep: SweepConfig{Interval: time.Hour}, StandbyRefresh: 5 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Close)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sb.KeepWarm(wctx)
	}()
	defer func() { stop(); <-done }()
	takeOver := func(from *Region, to *Region, epoch int64, traffic string) {
		t.Helper()
		serveFor(t, ctx, from, traffic, 300*time.Millisecond)
		from.Close()
		full, err := loadMem(ctx, old.pool, "us", clk.Now(), DefaultRetainClosed)
		if err != nil {
			t.Fatal(err)
		}
		_, warmBefore := to.Takeovers()
		if err := to.Lead(ctx, epoch); err != nil {
			t.Fatal(err)
		}
		if _, warm := to.Takeovers(); to == sb && warm != warmBefore+1 {
			t.Fatalf("takeover at epoch %d: %d warm takeovers, want %d", epoch, warm, warmBefore+1)
		}
		if to == sb {
			if err := sameCaughtUp(ctx, to.state.Load(), full, to, clk.Now(), clk.Now().Add(-DefaultRetainClosed)); err != nil {
				t.Fatalf("takeover at epoch %d: %v", epoch, err)
			}
		}
		if err := checkPoolBooks(ctx, to); err != nil {
			t.Fatal(err)
		}
	}
	takeOver(old, sb, 2, "a")
	sb.StepDown()
	third, err := New(Config{Name: "us", Clock: clk, Sweep: SweepConfig{Interval: time.Hour}, StandbyRefresh: -1, Logger: slog.New(slog.DiscardHandler)}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(third.Close)
	if err := third.Lead(ctx, 3); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, sb)
	takeOver(third, sb, 4, "b")
}

// waitWarm waits until r's KeepWarm has loaded a copy.
func waitWarm(t *testing.T, r *Region) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.warmSem <- struct{}{}
		ok := r.warm != nil
		<-r.warmSem
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby loaded no copy within 10 s")
		}
	}
}

// serveFor makes 16 callers reserve at r for d, each paying for or releasing every other
// hold it gets, with request keys that start with prefix.
func serveFor(t *testing.T, ctx context.Context, r *Region, prefix string, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	g, gctx := errgroup.WithContext(ctx)
	for c := range 16 {
		g.Go(func() error {
			for i := 0; time.Now().Before(end); i++ {
				res, err := r.Reserve(gctx, ReserveRequest{Sale: "s", SKU: "x", User: fmt.Sprintf("%s-%d-%d", prefix, c, i/5), Quantity: 1,
					RequestKey: fmt.Sprintf("%s-%d", prefix, i)})
				if err != nil {
					return err
				}
				switch i % 4 {
				case 1:
					_, err = r.Confirm(gctx, res.Hold.ID, "pay-"+res.Hold.ID)
				case 3:
					_, err = r.Release(gctx, res.Hold.ID)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestWarmStandbyMissingAChangeLoadsEverything: a change the stamps do not show (a writer
// that leaves holds.changed alone, as a binary from before the column would) makes the
// standby's copy fail its check at takeover; the new leader loads every hold instead, and
// serves the stored state.
func TestWarmStandbyMissingAChangeLoadsEverything(t *testing.T) {
	old, ctx := newInternalRegion(t)
	a, b := mustReserveIn(t, old, ctx, "ann", "k1", 2), mustReserveIn(t, old, ctx, "bob", "k1", 1)
	sb := newStandby(t, old)
	old.Close()
	// An unstamped release of a, as a writer that does not know the column would write it.
	if _, err := old.pool.Exec(ctx, `WITH r AS (UPDATE holds SET state = 'released', closed_at = $2 WHERE hold_id = $1 RETURNING quantity)
		UPDATE pools SET held = held - r.quantity, available = available + r.quantity FROM r WHERE sale_id = 's' AND sku = 'x'`,
		a.ID, old.cfg.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := sb.Lead(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if w, f := sb.stats.warmTakeovers.Load(), sb.stats.fullTakeovers.Load(); w != 0 || f != 1 {
		t.Fatalf("takeovers: %d warm, %d full; want the copy refused", w, f)
	}
	m := sb.state.Load()
	if h := m.holds[a.ID]; h == nil || h.State != Released {
		t.Fatalf("hold %s after the takeover: %+v, want it released", a.ID, h)
	}
	if h := m.holds[b.ID]; h == nil || h.State != Held {
		t.Fatalf("hold %s after the takeover: %+v, want it held", b.ID, h)
	}
	if err := checkPoolBooks(ctx, sb); err != nil {
		t.Fatal(err)
	}
}

// TestTakeoverThatCannotReadKeepsTheCopy: a takeover whose catch-up cannot read the changes
// fails without loading every hold, and keeps the standby's copy, from which the next
// takeover starts.
func TestTakeoverThatCannotReadKeepsTheCopy(t *testing.T) {
	old, ctx := newInternalRegion(t)
	a := mustReserveIn(t, old, ctx, "ann", "k1", 1)
	sb := newStandby(t, old)
	b := mustReserveIn(t, old, ctx, "bob", "k1", 1)
	old.Close()
	rename := func(from, to string) {
		t.Helper()
		if _, err := old.pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE holds RENAME COLUMN %s TO %s`, from, to)); err != nil {
			t.Fatal(err)
		}
	}
	rename("changed", "changed_away")
	if err := sb.Lead(ctx, 2); err == nil {
		t.Fatal("a takeover that could not read the changes led")
	}
	if full, warm := sb.Takeovers(); full != 0 || warm != 0 || sb.warm == nil {
		t.Fatalf("after the failed takeover: %d full, %d warm takeovers, copy kept %v; want none, and the copy", full, warm, sb.warm != nil)
	}
	rename("changed_away", "changed")
	if err := sb.Lead(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if full, warm := sb.Takeovers(); full != 0 || warm != 1 {
		t.Fatalf("the second takeover: %d full, %d warm; want it warm", full, warm)
	}
	for _, h := range []Hold{a, b} {
		if got := sb.state.Load().holds[h.ID]; got == nil || got.State != Held {
			t.Fatalf("hold %s after the takeover: %+v, want it held", h.ID, got)
		}
	}
}

// checkPoolBooks compares every pool's stored counters with the sums over its holds, archived
// ones included (I2).
func checkPoolBooks(ctx context.Context, r *Region) error {
	var bad int
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM pools p WHERE held <> coalesce((SELECT sum(quantity) FROM holds h
		WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND state = 'held'), 0) OR sold <> coalesce((SELECT sum(quantity)
		FROM holds h WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND state = 'sold'), 0) + coalesce((SELECT sum(quantity)
		FROM holds_closed h WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND state = 'sold'), 0)`).Scan(&bad)
	if err == nil && bad != 0 {
		err = fmt.Errorf("%d pools whose counters differ from their holds", bad)
	}
	return err
}

// sameCaughtUp compares a caught-up copy with a full load of the same snapshot, whose holds
// closed at or before keepAfter are retired. The copy may keep, as a leader does, what a load
// would not make: users whose counts are back to zero, and deadlines of holds closed since,
// until they pass.
func sameCaughtUp(ctx context.Context, got, want *memState, r *Region, now, keepAfter time.Time) error {
	if got.changed != want.changed || got.rows != want.rows {
		return fmt.Errorf("stamp %d over %d holds, want %d over %d", got.changed, got.rows, want.changed, want.rows)
	}
	if !maps.Equal(got.keysPer, want.keysPer) {
		return fmt.Errorf("request keys per buyer %v, the full load %v", got.keysPer, want.keysPer)
	}
	// Digests differ by seed from one state to another: check the copy's against the keys.
	rows, err := r.pool.Query(ctx, `SELECT sale_id, user_id, request_key FROM holds WHERE state <> 'held' AND closed_at <= $1`, keepAfter)
	if err != nil {
		return err
	}
	var k keyKey
	n := 0
	for rows.Next() {
		if err := rows.Scan(&k.sale, &k.user, &k.key); err != nil {
			return err
		}
		if !got.retiredKey(k) {
			return fmt.Errorf("key %v of a hold closed past the retention is not retired", k)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if int(got.retired.added) != n || int(want.retired.added) != n {
		return fmt.Errorf("%d keys retired, the full load %d; want %d", int(got.retired.added), int(want.retired.added), n)
	}
	live := &memState{pools: got.pools, users: got.users, keys: got.keys, holds: got.holds, closing: got.closing}
	for _, d := range got.due {
		if h := got.holds[d.id]; h != nil && h.State == Held {
			live.due = append(live.due, d)
		} else if !d.at.After(now) {
			return fmt.Errorf("the deadline of hold %s, closed, passed at %v and is still queued", d.id, d.at)
		}
	}
	loaded := &memState{pools: want.pools, users: want.users, keys: want.keys, holds: want.holds, closing: want.closing, due: want.due}
	return sameMemory(live, loaded)
}
