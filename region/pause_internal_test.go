package region

import (
	"context"
	"errors"
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
// committed and its caller gets an error), and it stops leading: split brain commits
// nothing of the old leader's.
func TestLeaderPausedMidTransaction(t *testing.T) {
	old, ctx := newInternalRegion(t) // epoch 1, 10 units of s/x
	hold := blockOp{make(chan struct{})}
	go old.submit(ctx, hold)
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
	go func() { _, err := old.submit(ctx, p); paused <- err }()
	resume := sync.OnceFunc(func() { close(p.resume) })
	t.Cleanup(resume) // a failed test must not leave the writer stalled
	waitQueued(old, 2)
	close(hold.ch)
	<-p.entered

	next, err := New(Config{Name: "us", Clock: old.cfg.Clock, SweepInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)}, old.pool)
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
	if err := <-paused; err == nil {
		t.Error("the paused batch's op succeeded after its leader was replaced")
	}
	if err := <-lost; err == nil {
		t.Error("the reserve in the paused batch was acknowledged; its hold was never committed")
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
