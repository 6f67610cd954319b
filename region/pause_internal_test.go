package region

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/fencing"
)

// pauseOp opens its batch's transaction (so the decisions before it are written and the
// epoch row is locked), says so, and then stalls like a leader under SIGSTOP until resumed.
type pauseOp struct{ entered, resume chan struct{} }

func (o pauseOp) apply(ctx context.Context, b *batch) (any, error, error) {
	tx, err := b.sqlOp(ctx)
	if err != nil {
		return nil, nil, err
	}
	close(o.entered)
	<-o.resume
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		return nil, nil, err
	}
	return "resumed", nil, nil
}

// TestLeaderPausedMidTransaction: the leader stalls inside a batch that holds the epoch row
// and has written a hold. Its successor still takes over within MaxIdleHoldingFence (the
// server ends the stalled transaction), answers NOT_LEADER at once while it waits, and then
// serves. When the old leader resumes, its batch fails (the hold it wrote was never
// committed and its caller is told NOT_LEADER), and it stops leading: split brain commits
// nothing of the old leader's.
func TestLeaderPausedMidTransaction(t *testing.T) {
	old, ctx := newInternalRegion(t) // epoch 1, 10 units of s/x
	hold := blockOp{make(chan struct{})}
	go submitOp[any](ctx, old.leadership, hold)
	for len(old.w.in) != 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the writer is inside hold: the next two share a batch
	lost := make(chan error, 1)
	go func() {
		_, err := old.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "u1", Quantity: 1, RequestKey: "k"})
		lost <- err
	}()
	waitQueued(old, 1)
	p := pauseOp{entered: make(chan struct{}), resume: make(chan struct{})}
	paused := make(chan error, 1)
	go func() { _, err := submitOp[any](ctx, old.leadership, p); paused <- err }()
	resume := sync.OnceFunc(func() { close(p.resume) })
	t.Cleanup(resume) // a failed test must not leave the writer stalled
	waitQueued(old, 2)
	close(hold.ch)
	<-p.entered

	next, err := New(Config{Name: "us", Clock: old.cfg.Clock, Sweep: SweepConfig{Interval: time.Hour}, Logger: slog.New(slog.DiscardHandler)}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Close)
	start := time.Now()
	led := make(chan error, 1)
	go func() { led <- next.Lead(ctx, 2) }()
	time.Sleep(200 * time.Millisecond)
	asked := time.Now()
	if _, err := next.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "u2", Quantity: 1, RequestKey: "k"}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("reserve at the successor while it waits for the epoch row: %v; want NOT_LEADER", err)
	}
	if took := time.Since(asked); took > time.Second {
		t.Errorf("reserve at the waiting successor took %v; want an answer at once", took)
	}
	select {
	case err := <-led:
		if err != nil {
			t.Fatalf("successor's Lead: %v", err)
		}
	case <-time.After(fencing.MaxIdleHoldingFence + 10*time.Second):
		resume()
		t.Fatalf("the successor was still waiting for the paused leader's transaction; then Lead: %v", <-led)
	}
	if took := time.Since(start); took > fencing.MaxIdleHoldingFence+2*time.Second {
		t.Errorf("successor led after %v; want within MaxIdleHoldingFence (%v) and a little", took, fencing.MaxIdleHoldingFence)
	}
	if _, err := next.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "u2", Quantity: 1, RequestKey: "k"}); err != nil {
		t.Fatalf("the successor does not serve: %v", err)
	}

	resume() // the old leader wakes up
	// Both are told to go to the new leader: nothing of theirs was committed, and a retry
	// there with the same key is safe.
	if err := <-paused; !errors.Is(err, ErrNotLeader) {
		t.Errorf("the paused batch's op after its leader was replaced: %v; want NOT_LEADER", err)
	}
	if err := <-lost; !errors.Is(err, ErrNotLeader) {
		t.Errorf("the reserve in the paused batch: %v; want NOT_LEADER (its hold was never committed)", err)
	}
	for deadline := time.Now().Add(10 * time.Second); old.Leading(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the old leader still leads after its batch failed")
		}
	}
	var u1, u2 int
	if err := old.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE user_id = 'u1'), count(*) FILTER (WHERE user_id = 'u2') FROM holds`).Scan(&u1, &u2); err != nil {
		t.Fatal(err)
	}
	if u1 != 0 || u2 != 1 {
		t.Errorf("holds of u1 (old leader's paused batch) %d, u2 (successor) %d; want 0 and 1", u1, u2)
	}
}

// TestSuccessorEndsAStalledHolderOfTheEpochRow: a transaction holds the epoch row with the
// server's idle timer off, as a leader stalled in the middle of sending a pipelined batch
// does (the timer runs only between queries). The successor ends it after epochWait and
// leads; the stalled transaction is gone, rolled back.
func TestSuccessorEndsAStalledHolderOfTheEpochRow(t *testing.T) {
	old, ctx := newInternalRegion(t) // epoch 1
	old.StepDown()
	conn, err := old.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT quota_check_epoch(1)`); err != nil { // the hot path's fence: FOR SHARE
		t.Fatal(err)
	}
	next, err := New(Config{Name: "us", Clock: old.cfg.Clock, Sweep: SweepConfig{Interval: time.Hour}, Logger: slog.New(slog.DiscardHandler)}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Close)
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, epochWait+10*time.Second)
	defer cancel()
	if err := next.Lead(lctx, 2); err != nil {
		t.Fatalf("successor's Lead with the epoch row held: %v", err)
	}
	if took := time.Since(start); took < epochWait || took > epochWait+3*time.Second {
		t.Errorf("successor led after %v; want after epochWait (%v), soon after", took, epochWait)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
		t.Error("the stalled transaction still runs after the successor took over")
	}
	if _, err := next.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "u", Quantity: 1, RequestKey: "k"}); err != nil {
		t.Errorf("the successor does not serve: %v", err)
	}
}

// lostReplyOp fails its batch as a COMMIT whose reply was lost does: the outcome is unknown.
type lostReplyOp struct{}

func (lostReplyOp) apply(context.Context, *batch) (any, error, error) {
	return nil, nil, fmt.Errorf("%w: commit: connection reset (simulated)", ErrUnknownOutcome)
}

// TestUnknownOutcomeStaysUnknownWhenDeposed: a batch whose outcome is unknown fails after a
// newer leader took over. Its caller is told the outcome is unknown (ask again, with the same
// key), not NOT_LEADER, which would say that nothing was done.
func TestUnknownOutcomeStaysUnknownWhenDeposed(t *testing.T) {
	old, ctx := newInternalRegion(t)
	next, err := New(Config{Name: "us", Clock: old.cfg.Clock, Sweep: SweepConfig{Interval: time.Hour}, Logger: slog.New(slog.DiscardHandler)}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Close)
	if err := next.Lead(ctx, 2); err != nil {
		t.Fatal(err)
	}
	_, err = submitOp[any](ctx, old.leadership, lostReplyOp{})
	if !errors.Is(err, ErrUnknownOutcome) || errors.Is(err, ErrNotLeader) {
		t.Fatalf("a batch of unknown outcome at a deposed leader: %v; want outcome unknown, not NOT_LEADER", err)
	}
	for deadline := time.Now().Add(10 * time.Second); old.Leading(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the deposed leader still leads")
		}
	}
}
