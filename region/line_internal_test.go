package region

// White-box tests of the line writer's batches whose outcome is unknown: an insert is
// undone and answered ABORTED only once nothing of its batch can commit any more, an update
// (never undone) is answered UNKNOWN_OUTCOME, and a batch that cannot be undone ends the
// term.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/admission"
)

// newTestLineWriter is a line writer of r (its term's epoch is 1) whose batches time out
// after timeout.
func newTestLineWriter(t *testing.T, r *Region, timeout time.Duration) *lineWriter {
	t.Helper()
	lw := newLineWriter(r.pool, r.cfg.Logger, r.stepDownTerm)
	lw.timeout = timeout
	t.Cleanup(lw.close)
	return lw
}

// blockLine begins a transaction that inserts, uncommitted, the queued row (s, id) (a writer
// inserting that key waits for it) and locks the row (s, locked) for update, which must
// exist (a writer updating it waits too).
func blockLine(t *testing.T, r *Region, ctx context.Context, id, locked string) pgx.Tx {
	t.Helper()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tx.Rollback(context.Background()); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Error(err)
		}
	})
	if id != "" {
		if _, err := tx.Exec(ctx, `INSERT INTO line_entries (sale_id, admission_id, user_id, seq, entered_at)
			VALUES ('s', $1, 'blocker', 1000000, now())`, id); err != nil {
			t.Fatal(err)
		}
	}
	if locked != "" {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM line_entries WHERE sale_id = 's' AND admission_id = $1 FOR UPDATE`, locked); err != nil {
			t.Fatal(err)
		}
	}
	return tx
}

// lineRows counts the rows of (s, id).
func lineRows(t *testing.T, r *Region, ctx context.Context, id string) int {
	t.Helper()
	var n int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM line_entries WHERE sale_id = 's' AND admission_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLineWriterUndoesAfterDeadline: a batch whose deadline passes while its INSERT waits
// (the usual unknown outcome) is undone under a context of its own: its backend is ended and
// the insert answered ABORTED, and the row does not commit once the wait is over. Before,
// the undo ran under the spent deadline and failed: the arrival was let go in memory while
// its row could still commit.
func TestLineWriterUndoesAfterDeadline(t *testing.T) {
	r, ctx := newInternalRegion(t)
	lw := newTestLineWriter(t, r, 300*time.Millisecond)
	tx := blockLine(t, r, ctx, "new", "")
	var settled error
	err := lw.record(ctx, &lineReq{epoch: 1, insert: true, row: lineRow{sale: "s", id: "new", user: "ann", at: time.Now()},
		settle: func(err error) { settled = err }})
	if !errors.Is(err, ErrAborted) || !errors.Is(settled, ErrAborted) {
		t.Fatalf("insert past its deadline answered %v (settled %v); want ABORTED, undone", err, settled)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if n := lineRows(t, r, ctx, "new"); n != 0 {
			t.Fatalf("the undone insert committed %d rows once its wait was over", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !r.Leading() {
		t.Fatal("the region stepped down after a batch it undid")
	}
}

// TestLineWriterUpdateUnknownOutcome: an update whose batch lost its connection mid-commit is
// answered UNKNOWN_OUTCOME, not ABORTED: undoing the batch deletes only its inserts, so the
// update may have committed.
func TestLineWriterUpdateUnknownOutcome(t *testing.T) {
	r, ctx := newInternalRegion(t)
	lw := newTestLineWriter(t, r, lineWriteTimeout)
	if _, err := r.pool.Exec(ctx, `INSERT INTO line_entries (sale_id, admission_id, user_id, seq, entered_at)
		VALUES ('s', 'up', 'bob', 1, now())`); err != nil {
		t.Fatal(err)
	}
	blockLine(t, r, ctx, "", "up")
	done := make(chan error, 1)
	go func() {
		done <- lw.record(ctx, &lineReq{epoch: 1, settle: func(error) {},
			row: lineRow{sale: "s", id: "up", state: lineAdmitted, expires: time.Now().Add(time.Hour)}})
	}()
	// The writer's backend waits for the row lock: end it, as a lost connection would.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var ended bool
		err := r.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) > 0 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&ended)
		if err != nil {
			t.Fatal(err)
		}
		if ended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer's update never waited for the row lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := <-done; !errors.Is(err, ErrUnknownOutcome) || errors.Is(err, ErrAborted) {
		t.Fatalf("update whose connection was lost answered %v; want UNKNOWN_OUTCOME", err)
	}
}

// TestLineWriterStepsDownWhenUndoFails: a batch whose outcome is unknown and that cannot be
// undone leaves memory and rows that may disagree, so the region steps down (a new term loads
// the line behind the epoch fence), and the insert is answered UNKNOWN_OUTCOME.
func TestLineWriterStepsDownWhenUndoFails(t *testing.T) {
	r, ctx := newInternalRegion(t)
	lw := newTestLineWriter(t, r, 300*time.Millisecond)
	lw.undoTimeout = time.Nanosecond // the undo cannot reach the database in time
	tx := blockLine(t, r, ctx, "new", "")
	err := lw.record(ctx, &lineReq{epoch: 1, insert: true, row: lineRow{sale: "s", id: "new", user: "ann", at: time.Now()},
		settle: func(error) {}})
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("insert that could not be undone answered %v; want UNKNOWN_OUTCOME", err)
	}
	select {
	case <-r.Stopped():
	case <-time.After(5 * time.Second):
		t.Fatal("the region still leads with a line batch it could not undo")
	}
	// Another term's writer is left alone.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Lead(ctx, 2); err != nil {
		t.Fatal(err)
	}
	lw.lost(1)
	time.Sleep(50 * time.Millisecond)
	if !r.Leading() {
		t.Fatal("a lost batch of term 1 stepped term 2 down")
	}
}

// TestWaitlistOfferMadeWhenRecordOutlivesCaller: an offer whose record commits after the
// offering pass gave up waiting (its context ended first) is still made in memory, its unit
// set aside, as its row says. Before, a pass that saw an error made no offer at all while the
// rows said admitted.
func TestWaitlistOfferMadeWhenRecordOutlivesCaller(t *testing.T) {
	r, ctx := newInternalRegion(t)
	d, err := NewDoor(r, DoorConfig{Keys: func() *admission.Keyring { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if _, err := d.ensureLoaded(ctx); err != nil {
		t.Fatal(err)
	}
	terms, err := r.terms(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	wl, err := d.offers.waitlist(terms, "x")
	if err != nil {
		t.Fatal(err)
	}
	now := r.cfg.Clock.Now()
	var ids []string
	for _, user := range []string{"ann", "bob"} {
		_, a, err := wl.list.Arrive(user, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.recordArrival(ctx, wl.epoch, "s", "x", a, now, func(ok bool) admission.Entry {
			return wl.list.Settle(a, ok, now)
		}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.ID)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	d.offers.offer(gone, wl, 1, now) // it returns before the record commits
	deadline := time.Now().Add(5 * time.Second)
	for wl.list.SetAside() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the recorded offer was never made: no unit set aside")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var state string
	var units int64
	if err := r.pool.QueryRow(ctx, `SELECT state, units FROM line_entries WHERE admission_id = $1`, ids[0]).Scan(&state, &units); err != nil {
		t.Fatal(err)
	}
	if e, _ := wl.list.Get(ids[0], now); e.State != admission.Admitted || state != lineAdmitted || units != 1 {
		t.Fatalf("ann's offer in memory %+v, stored %s with %d units", e, state, units)
	}
	if e, _ := wl.list.Get(ids[1], now); e.State != admission.Queued || e.Position != 1 {
		t.Fatalf("bob %+v; want first in line", e)
	}
}

// TestPruneDeletesEndedEntries: the pruning pass deletes a waitlist offer that ended more than
// twice the offer TTL ago and a buyer bound elsewhere that long ago (for a sale of no ticket
// TTL), and keeps what is queued and what ended recently.
func TestPruneDeletesEndedEntries(t *testing.T) {
	r, ctx := newInternalRegion(t)
	d, err := NewDoor(r, DoorConfig{Keys: func() *admission.Keyring { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	epoch, err := d.ensureLoaded(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := r.cfg.Clock.Now()
	old, recent := now.Add(-time.Hour), now.Add(-time.Second)
	if _, err := r.pool.Exec(ctx, `INSERT INTO line_entries (sale_id, admission_id, user_id, sku, seq, state, expires_at, units, bound_region, entered_at) VALUES
		('s', 'a-old', 'ann', 'x', 1, 'admitted', $1, 1, '', $1),
		('s', 'a-new', 'bob', 'x', 2, 'admitted', $2, 1, '', $2),
		('s', 'q', 'cid', 'x', 3, 'queued', NULL, 0, '', $1),
		('s', 'e-old', 'dan', '', 4, 'elsewhere', NULL, 0, 'eu', $1)`, old, recent); err != nil {
		t.Fatal(err)
	}
	n, err := d.prune(ctx, epoch, now)
	if err != nil || n != 2 {
		t.Fatalf("prune: deleted %d, %v; want the old offer and the old elsewhere entry", n, err)
	}
	for id, want := range map[string]int{"a-old": 0, "e-old": 0, "a-new": 1, "q": 1} {
		if got := lineRows(t, r, ctx, id); got != want {
			t.Errorf("entry %s: %d rows left, want %d", id, got, want)
		}
	}
}
