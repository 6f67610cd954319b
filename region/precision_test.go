package region_test

import (
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/region"
)

// TestSubMicrosecondClock: PostgreSQL keeps microseconds, clocks give nanoseconds. The hold a
// reserve returns must be the hold that is stored (a replay or a read answers the same
// deadline), and a payment that arrives before the deadline the client was given sells.
func TestSubMicrosecondClock(t *testing.T) {
	e := newEnv(t)
	e.r.Close()
	e.clk = clock.NewManual(t0.Add(900 * time.Nanosecond))
	e.r = e.newRegion(2)
	e.sale(defaultTerms(testSale, 5), 10)

	res := e.mustReserve("alice", "k", 1)
	stored, err := e.r.GetReservation(e.ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !stored.ExpiresAt.Equal(res.ExpiresAt) || !stored.CreatedAt.Equal(res.CreatedAt) {
		t.Errorf("reserve answered created %s expires %s; stored created %s expires %s",
			res.CreatedAt.Format(time.RFC3339Nano), res.ExpiresAt.Format(time.RFC3339Nano),
			stored.CreatedAt.Format(time.RFC3339Nano), stored.ExpiresAt.Format(time.RFC3339Nano))
	}
	replay, err := e.reserve("alice", "k", 1)
	if err != nil || !replay.Replayed || !replay.Hold.ExpiresAt.Equal(res.ExpiresAt) {
		t.Errorf("replay: %+v, %v; want the original deadline %s", replay, err, res.ExpiresAt.Format(time.RFC3339Nano))
	}

	// Just before the deadline the client was given: the payment buys the hold.
	e.clk.Advance(res.ExpiresAt.Sub(e.clk.Now()) - 100*time.Nanosecond)
	if !e.clk.Now().Before(res.ExpiresAt) {
		t.Fatal("test clock is not before the deadline")
	}
	c, err := e.r.Confirm(e.ctx, res.ID, "pay")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Sold {
		t.Errorf("confirm at %s, before the deadline %s the client was given: refunded (%s)",
			e.clk.Now().Format(time.RFC3339Nano), res.ExpiresAt.Format(time.RFC3339Nano), c.Reason)
	}
}

// TestPutSaleIsIdempotentAtStoragePrecision: terms whose times are finer than the database
// keeps (opens_at in nanoseconds, a TTL with sub-millisecond part) can be put again (the
// coordinator retries), and the TTL used for holds is the same before and after a reload.
func TestPutSaleIsIdempotentAtStoragePrecision(t *testing.T) {
	e := newEnv(t)
	terms := region.SaleTerms{Sale: testSale, SKUs: []string{testSKU}, PerUserLimit: 5,
		HoldTTL: 90*time.Second + 1500*time.Microsecond, OpensAt: t0.Add(-time.Hour + 1234567*time.Nanosecond)}
	if err := e.r.PutSale(e.ctx, 1, terms); err != nil {
		t.Fatal(err)
	}
	if err := e.r.PutSale(e.ctx, 1, terms); err != nil {
		t.Errorf("putting the same terms again: %v", err)
	}
	if _, err := e.r.Credit(e.ctx, region.CreditRequest{Generation: 1, TransferID: "t1", Sale: testSale, SKU: testSKU, Units: 10}); err != nil {
		t.Fatal(err)
	}
	before := e.mustReserve("u", "k1", 1)
	// A new leader loads the terms from the database.
	e.r = e.newRegion(2)
	if err := e.r.PutSale(e.ctx, 1, terms); err != nil {
		t.Errorf("putting the same terms again after a reload: %v", err)
	}
	after := e.mustReserve("u", "k2", 1)
	if ttlB, ttlA := before.ExpiresAt.Sub(before.CreatedAt), after.ExpiresAt.Sub(after.CreatedAt); ttlB != ttlA {
		t.Errorf("hold TTL %s before the reload, %s after", ttlB, ttlA)
	}
}
