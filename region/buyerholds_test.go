package region_test

import (
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
)

// TestBuyerHoldsListsOneBuyersHolds: a buyer's holds come back newest first with their
// states as committed (held, sold, released), archived ones included, another buyer's and
// another sale's never; limit cuts the newest and says so; bad input names its field.
func TestBuyerHoldsListsOneBuyersHolds(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 10), 100)
	e.sale(defaultTerms("other", 10), 100)
	var alice []region.Hold
	for _, key := range []string{"k1", "k2", "k3", "k4"} {
		alice = append(alice, e.mustReserve("alice", key, 1))
		e.mustReserve("bob", key, 1)
		e.clk.Advance(time.Second)
	}
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: "other", SKU: testSKU, User: "alice", Quantity: 1, RequestKey: "k9"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.Confirm(e.ctx, alice[0].ID, "pay-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.Release(e.ctx, alice[1].ID); err != nil {
		t.Fatal(err)
	}
	// alice's sold hold moves to the archive, as the archiver moves closed holds.
	if _, err := e.pool.Exec(e.ctx, `WITH moved AS (DELETE FROM holds WHERE hold_id = $1 RETURNING *)
		INSERT INTO holds_closed (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state,
			created_at, expires_at, closed_at, payment_id, admission_id, archived)
		SELECT hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state,
			created_at, expires_at, closed_at, payment_id, admission_id, 1 FROM moved`, alice[0].ID); err != nil {
		t.Fatal(err)
	}

	got, truncated, err := e.r.BuyerHolds(e.ctx, testSale, "alice", 0)
	if err != nil || truncated {
		t.Fatalf("BuyerHolds: truncated %v, err %v", truncated, err)
	}
	want := []struct {
		id    string
		state region.HoldState
	}{{alice[3].ID, region.Held}, {alice[2].ID, region.Held}, {alice[1].ID, region.Released}, {alice[0].ID, region.Sold}}
	if len(got) != len(want) {
		t.Fatalf("got %d holds, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].ID != w.id || got[i].State != w.state || got[i].User != "alice" || got[i].Sale != testSale {
			t.Errorf("hold %d: got %s %s of %s/%s, want %s %s", i, got[i].ID, got[i].State, got[i].Sale, got[i].User, w.id, w.state)
		}
	}
	if got[3].PaymentID != "pay-1" {
		t.Errorf("archived sold hold: payment %q, want pay-1", got[3].PaymentID)
	}

	two, truncated, err := e.r.BuyerHolds(e.ctx, testSale, "alice", 2)
	if err != nil || !truncated || len(two) != 2 || two[0].ID != alice[3].ID || two[1].ID != alice[2].ID {
		t.Fatalf("limit 2: %d holds, truncated %v, err %v; want the newest two and truncated", len(two), truncated, err)
	}
	if none, truncated, err := e.r.BuyerHolds(e.ctx, testSale, "carol", 0); err != nil || truncated || len(none) != 0 {
		t.Fatalf("a buyer with no hold: %v, %v, %v", none, truncated, err)
	}

	for _, c := range []struct {
		sale, user string
		limit      int
		field      string
	}{
		{"", "alice", 0, "sale_id"},
		{testSale, "", 0, "user_id"},
		{testSale, "alice", -1, "limit"},
		{testSale, "alice", region.MaxBuyerHolds + 1, "limit"},
	} {
		if _, _, err := e.r.BuyerHolds(e.ctx, c.sale, c.user, c.limit); fieldOf(err) != c.field {
			t.Errorf("BuyerHolds(%q, %q, %d): %v; want an invalid %s", c.sale, c.user, c.limit, err, c.field)
		}
	}
}
