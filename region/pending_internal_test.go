package region

import (
	"context"
	"errors"
	"testing"
	"time"
)

// blockOp holds the writer until ch is closed.
type blockOp struct{ ch chan struct{} }

func (o blockOp) apply(context.Context, *batch) (any, error, error) { <-o.ch; return "ok", nil, nil }

func waitQueued(r *Region, n int) {
	for len(r.w.in) < n {
		time.Sleep(time.Millisecond)
	}
}

// TestGivenUpReserveStillCountsAsInWriter: a caller that gives up on a queued reserve is
// answered "outcome unknown", but its key counts as in the writer until the op is done, so a
// retry meanwhile is not told REGION_EXHAUSTED by the empty-pool answer while the first
// attempt is about to get (or has got) a hold. (Found in review; reproduced before the fix.)
func TestGivenUpReserveStillCountsAsInWriter(t *testing.T) {
	r, ctx := newInternalRegion(t) // 10 units of s/x
	r.w.max = 1                    // one op per batch, so each op's commit can be watched
	y, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "y", Quantity: 9, RequestKey: "ky"})
	if err != nil {
		t.Fatal(err)
	}
	b1, b2 := blockOp{make(chan struct{})}, blockOp{make(chan struct{})}
	go submitOp[any](ctx, r.leadership, b1)
	for len(r.w.in) != 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)                                                                // the writer is inside b1
	go r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "z", Quantity: 1, RequestKey: "kz"}) // the last unit
	waitQueued(r, 1)
	go submitOp[any](ctx, r.leadership, b2)
	waitQueued(r, 2)
	go r.Release(ctx, y.Hold.ID) // gives 9 back, after b2
	waitQueued(r, 3)
	cctx, cancel := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() {
		_, err := r.Reserve(cctx, ReserveRequest{Sale: "s", SKU: "x", User: "a", Quantity: 1, RequestKey: "k"})
		first <- err
	}()
	waitQueued(r, 4)
	cancel()
	if err := <-first; !errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, context.Canceled) {
		t.Fatalf("given-up reserve: %v; want outcome unknown", err)
	}
	close(b1.ch) // kz commits: the cached pool is empty; the writer now waits in b2
	for a, _ := r.cachedAvailable(poolKey{"s", "x"}); a != 0; a, _ = r.cachedAvailable(poolKey{"s", "x"}) {
		time.Sleep(time.Millisecond)
	}
	retry := make(chan error, 1)
	go func() {
		_, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "a", Quantity: 1, RequestKey: "k"})
		retry <- err
	}()
	time.Sleep(50 * time.Millisecond)
	close(b2.ch)
	if err := <-retry; err != nil {
		t.Fatalf("retry of a key still in the writer: %v; want the hold the first attempt got", err)
	}
}
