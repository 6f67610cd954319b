package region

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/clock"
	"golang.org/x/sync/errgroup"
)

// TestLoadRebuildsTheLeadersMemory: a takeover that reads the holds in many chunks (the
// reading and the filling of the maps run in two goroutines) rebuilds exactly the memory of
// the leader that made them, over two sales: pools, every hold and key, users' counts,
// deadlines and the queue of closed holds to retire, oldest first; and past the retention,
// the live holds and their keys, the users' counts and one digest per closed hold.
func TestLoadRebuildsTheLeadersMemory(t *testing.T) {
	const users = 3*loadChunk + 40 // two holds each: several chunks, the last one short
	old, ctx := newInternalRegion(t)
	clk := old.cfg.Clock.(*clock.Manual)
	second := SaleTerms{Sale: "t", SKUs: []string{"y"}, PerUserLimit: 10, HoldTTL: time.Minute, OpensAt: clk.Now().Add(-time.Hour)}
	if err := old.PutSale(ctx, 1, second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []CreditRequest{{Sale: "s", SKU: "x", TransferID: "t2"}, {Sale: "t", SKU: "y", TransferID: "t3"}} {
		c.Generation, c.Units = 1, users
		if _, err := old.Credit(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Four rounds a second apart: holds close at different times.
	for round := range 4 {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(32)
		for i := round; i < users; i += 4 {
			g.Go(func() error { return reserveTwoAndClose(gctx, old, i) })
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
	}
	// Each state is read once its leader has closed, or before its leader handles anything.
	want := old.state.Load()
	r := takeOverFrom(t, old, 2)
	got := r.state.Load()
	r.cfg.Clock.(*clock.Manual).Advance(DefaultRetainClosed + time.Second)
	later := takeOverFrom(t, r, 3).state.Load()

	if err := sameMemory(got, want); err != nil {
		t.Fatalf("within the retention: %v", err)
	}
	closed := users + (users+2)/3
	if len(got.holds) != 2*users || len(got.closing) != closed {
		t.Fatalf("within the retention: %d holds, %d queued to retire; want %d and %d", len(got.holds), len(got.closing), 2*users, closed)
	}
	live := 2*users - closed
	if int(later.retired.added) != closed || len(later.closing) != 0 || len(later.holds) != live || len(later.keys) != live || len(later.due) != live {
		t.Fatalf("past the retention: %d retired, %d queued, %d whole, %d keys, %d deadlines; want %d, 0, and %d of each",
			int(later.retired.added), len(later.closing), len(later.holds), len(later.keys), len(later.due), closed, live)
	}
	for id, h := range later.holds {
		if w := want.holds[id]; h.State != Held || w == nil || !sameHold(h.Hold, w.Hold) || h.hash != w.hash ||
			later.keys[keyKey{h.Sale, h.User, h.RequestKey}] != h {
			t.Fatalf("past the retention, hold %s: %+v, want it held as %+v, under its key", id, h, w)
		}
	}
	if err := sameUsers(later.users, want.users); err != nil {
		t.Fatalf("past the retention: %v", err)
	}
}

// reserveTwoAndClose makes user i two holds, of sale s or t by i's parity, and closes some:
// every user's first hold is sold, and every third user's second one released.
func reserveTwoAndClose(ctx context.Context, r *Region, i int) error {
	user := fmt.Sprintf("u%04d", i)
	sale, sku := "s", "x"
	if i%2 == 1 {
		sale, sku = "t", "y"
	}
	var holds [2]Hold
	for k := range holds {
		res, err := r.Reserve(ctx, ReserveRequest{Sale: sale, SKU: sku, User: user, Quantity: 1, RequestKey: fmt.Sprint("k", k)})
		if err != nil {
			return err
		}
		holds[k] = res.Hold
	}
	if _, err := r.Confirm(ctx, holds[0].ID, "pay-"+user); err != nil {
		return err
	}
	if i%3 == 0 {
		_, err := r.Release(ctx, holds[1].ID)
		return err
	}
	return nil
}

// sameMemory compares what a load rebuilds of a state with the state a leader built.
func sameMemory(got, want *memState) error {
	if len(got.pools) != len(want.pools) {
		return fmt.Errorf("%d pools, want %d", len(got.pools), len(want.pools))
	}
	for k, p := range want.pools {
		if g := got.pools[k]; g == nil || *g != *p {
			return fmt.Errorf("pool %v: %+v, want %+v", k, g, p)
		}
	}
	if len(got.holds) != len(want.holds) || len(got.keys) != len(want.keys) {
		return fmt.Errorf("%d holds, %d keys; want %d, %d", len(got.holds), len(got.keys), len(want.holds), len(want.keys))
	}
	for id, h := range want.holds {
		g := got.holds[id]
		if g == nil || g.Hold.ID != h.ID || g.hash != h.hash || !sameHold(g.Hold, h.Hold) {
			return fmt.Errorf("hold %s: %+v, want %+v", id, g, h)
		}
		if k := got.keys[keyKey{h.Sale, h.User, h.RequestKey}]; k != g {
			return fmt.Errorf("key of hold %s leads to %+v", id, k)
		}
	}
	deadlines := map[string]time.Time{}
	for _, h := range want.holds {
		if h.State == Held {
			deadlines[h.ID] = h.ExpiresAt
		}
	}
	if len(got.due) != len(deadlines) || int(got.retired.added) != 0 {
		return fmt.Errorf("%d deadlines, %d retired; want one per held hold, %d, and none", len(got.due), int(got.retired.added), len(deadlines))
	}
	for _, d := range got.due {
		if at, ok := deadlines[d.id]; !ok || !at.Equal(d.at) {
			return fmt.Errorf("deadline of %s: %v, want %v", d.id, d.at, at)
		}
	}
	queued := map[string]time.Time{}
	for _, c := range want.closing {
		queued[c.id] = c.at
	}
	for i, c := range got.closing {
		if at, ok := queued[c.id]; !ok || !at.Equal(c.at) || (i > 0 && c.at.Before(got.closing[i-1].at)) {
			return fmt.Errorf("queued to retire: %s at %v (out of order, or want %v)", c.id, c.at, at)
		}
	}
	if len(got.closing) != len(want.closing) {
		return fmt.Errorf("%d queued to retire, want %d", len(got.closing), len(want.closing))
	}
	return sameUsers(got.users, want.users)
}

// sameHold compares two holds, their times as instants.
func sameHold(a, b Hold) bool {
	ta, tb := [2]time.Time{a.CreatedAt, a.ExpiresAt}, [2]time.Time{b.CreatedAt, b.ExpiresAt}
	a.CreatedAt, a.ExpiresAt, b.CreatedAt, b.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b && ta[0].Equal(tb[0]) && ta[1].Equal(tb[1])
}

// sameUsers compares per-user counts; a user with nothing held or bought may be missing.
func sameUsers(got, want map[userKey]*memUser) error {
	for _, pair := range [2][2]map[userKey]*memUser{{want, got}, {got, want}} {
		for k, u := range pair[0] {
			o := pair[1][k]
			if o == nil {
				o = &memUser{}
			}
			if *o != *u {
				return fmt.Errorf("user %v: %+v, want %+v", k, got[k], want[k])
			}
		}
	}
	return nil
}
