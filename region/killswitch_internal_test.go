package region

import (
	"errors"
	"testing"
)

// TestWarmStandbyTakesOverPaused: a pause made after a standby loaded its warm copy (and a
// resume of another, made before) is in the copy once it is caught up at takeover, so the
// new leader refuses the paused SKU from its first request, and sells the resumed one.
func TestWarmStandbyTakesOverPaused(t *testing.T) {
	old, ctx := newInternalRegion(t)
	if err := old.PutSale(ctx, 1, SaleTerms{Sale: "s2", SKUs: []string{"x"}, PerUserLimit: 10, HoldTTL: old.cfg.Sweep.RetainClosed,
		OpensAt: old.cfg.Clock.Now().Add(-1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t-s2", Sale: "s2", SKU: "x", Units: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.SetPaused(ctx, PauseRequest{Generation: 1, Sale: "s2", Paused: true, Version: 1}); err != nil {
		t.Fatal(err)
	}
	sb := newStandby(t, old)
	if _, err := old.SetPaused(ctx, PauseRequest{Generation: 1, Sale: "s2", Version: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.SetPaused(ctx, PauseRequest{Generation: 1, Sale: "s", SKU: "x", Paused: true, Reason: "r", Version: 3}); err != nil {
		t.Fatal(err)
	}
	old.Close()
	if err := sb.Lead(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if w := sb.stats.warmTakeovers.Load(); w != 1 {
		t.Fatalf("%d warm takeovers; want the copy used", w)
	}
	if _, err := sb.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 1, RequestKey: "k"}); !errors.Is(err, ErrPaused) {
		t.Fatalf("reserve of a SKU paused after the copy loaded: %v; want PAUSED", err)
	}
	if _, err := sb.Reserve(ctx, ReserveRequest{Sale: "s2", SKU: "x", User: "ann", Quantity: 1, RequestKey: "k"}); err != nil {
		t.Fatalf("reserve of a sale resumed after the copy loaded: %v", err)
	}
}
