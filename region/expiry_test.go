package region_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// TestExpiryRacesPayment: 1,000 holds made at the same instant; the clock stands 1ms before
// their deadline while all 1,000 confirms and repeated sweeps run concurrently, and crosses
// the deadline in the middle. Every hold ends exactly one of sold or expired, a sale only
// before the deadline, every refusal is a recorded late payment, and the pool matches.
func TestExpiryRacesPayment(t *testing.T) {
	const n = 1000
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 1), n)

	holds := make([]region.Hold, n)
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.reserve(fmt.Sprintf("user-%d", i), "k", 1)
			if err != nil {
				errs <- err
			}
			holds[i] = res.Hold
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("reserve: %v", <-errs)
	}
	deadline := t0.Add(testTTL)
	for _, h := range holds {
		if !h.ExpiresAt.Equal(deadline) {
			t.Fatalf("hold %s expires at %s, want %s", h.ID, h.ExpiresAt, deadline)
		}
	}
	e.checkPool(testSale, testSKU, counts{0, n, 0})

	e.clk.Advance(testTTL - time.Millisecond)

	results := make([]region.ConfirmResult, n)
	var done atomic.Int64
	crossed := make(chan struct{})
	stopSweeps := make(chan struct{})
	var sweepWG sync.WaitGroup
	var swept atomic.Int64
	for range 3 {
		sweepWG.Add(1)
		go func() {
			defer sweepWG.Done()
			for {
				select {
				case <-stopSweeps:
					return
				default:
				}
				k, err := e.r.SweepNow(e.ctx)
				if err != nil {
					errs <- fmt.Errorf("sweep: %w", err)
					return
				}
				swept.Add(int64(k))
			}
		}()
	}
	// The clock crosses the deadline once a quarter of the confirms have been answered,
	// while the first half are still arriving; the second half start after it.
	go func() {
		for done.Load() < n/4 {
			time.Sleep(100 * time.Microsecond)
		}
		e.clk.Advance(2 * time.Millisecond)
		close(crossed)
	}()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i >= n/2 {
				<-crossed
			}
			res, err := e.r.Confirm(e.ctx, holds[i].ID, fmt.Sprintf("pay-%d", i))
			if err != nil {
				errs <- fmt.Errorf("confirm %d: %w", i, err)
			}
			results[i] = res
			done.Add(1)
		}()
	}
	wg.Wait()
	close(stopSweeps)
	sweepWG.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// What each confirm was told agrees with what was stored.
	type row struct {
		state, payment string
		closedAt       time.Time
		late           int
	}
	stored := map[string]row{}
	rows, err := e.pool.Query(e.ctx, `SELECT h.hold_id, h.state, coalesce(h.payment_id, ''), h.closed_at,
		(SELECT count(*) FROM late_payments l WHERE l.hold_id = h.hold_id) FROM holds h`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.state, &r.payment, &r.closedAt, &r.late); err != nil {
			t.Fatal(err)
		}
		stored[id] = r
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	sold, expired := 0, 0
	for i, res := range results {
		h := holds[i]
		r := stored[h.ID]
		pay := fmt.Sprintf("pay-%d", i)
		if res.Hold.ID != h.ID {
			t.Fatalf("confirm %d answered for hold %q, want %s", i, res.Hold.ID, h.ID)
		}
		if res.Sold {
			sold++
			if r.state != "sold" || r.payment != pay || r.late != 0 {
				t.Errorf("hold %d: told sold, stored %+v", i, r)
			}
			if !r.closedAt.Before(deadline) {
				t.Errorf("hold %d sold at %s, not before its deadline %s", i, r.closedAt, deadline)
			}
		} else {
			expired++
			if r.state != "expired" || r.payment != "" || r.late != 1 || res.Hold.State != region.Expired {
				t.Errorf("hold %d: told refund (%s), stored %+v", i, res.Hold.State, r)
			}
			if n := count(t, e.pool, `SELECT count(*) FROM late_payments WHERE hold_id = $1 AND payment_id = $2 AND hold_state = 'expired'`, h.ID, pay); n != 1 {
				t.Errorf("hold %d: refused payment %s not recorded", i, pay)
			}
			if r.closedAt.Before(deadline) {
				t.Errorf("hold %d expired at %s, before its deadline %s", i, r.closedAt, deadline)
			}
		}
		if i >= n/2 && res.Sold {
			t.Errorf("hold %d confirmed after the deadline was sold", i)
		}
	}
	if sold < n/4 || expired < n/2 {
		t.Errorf("sold %d, expired %d: want at least %d sold (before the deadline) and %d refused (after)", sold, expired, n/4, n/2)
	}
	if sold+expired != n {
		t.Errorf("sold %d + expired %d != %d", sold, expired, n)
	}
	if got := count(t, e.pool, `SELECT count(*) FROM holds WHERE state = 'sold'`); got != sold {
		t.Errorf("%d sold rows, %d confirms said sold", got, sold)
	}
	if got := count(t, e.pool, `SELECT count(*) FROM holds WHERE state = 'expired'`); got != expired {
		t.Errorf("%d expired rows, %d confirms said refund", got, expired)
	}
	if got := count(t, e.pool, `SELECT count(*) FROM holds h JOIN late_payments l USING (hold_id) WHERE h.state = 'sold'`); got != 0 {
		t.Errorf("%d sold holds also have a refused payment", got)
	}
	if got := count(t, e.pool, `SELECT count(*) FROM late_payments`); got != expired {
		t.Errorf("%d late payments, want %d", got, expired)
	}
	if got := swept.Load(); got > int64(expired) {
		t.Errorf("sweeps expired %d holds, but only %d are expired", got, expired)
	}
	e.checkPool(testSale, testSKU, counts{transfer.Units(expired), 0, transfer.Units(sold)})
	t.Logf("sold %d, expired %d (%d by the sweeper, %d by confirm)", sold, expired, swept.Load(), int64(expired)-swept.Load())
}

// TestBackgroundSweeper: without SweepNow, the region's own sweeper expires due holds and
// returns their units.
func TestBackgroundSweeper(t *testing.T) {
	e := newEnv(t, func(c *region.Config) { c.Sweep.Interval = 5 * time.Millisecond; c.Sweep.Batch = 2 })
	e.sale(defaultTerms(testSale, 10), 10)
	var ids []string
	for i := range 5 {
		ids = append(ids, e.mustReserve(fmt.Sprintf("u%d", i), "k", 1).ID)
	}
	e.clk.Advance(testTTL)
	deadline := time.Now().Add(10 * time.Second)
	for count(t, e.pool, `SELECT count(*) FROM holds WHERE state = 'held'`) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	for _, id := range ids {
		if h, err := e.r.GetReservation(e.ctx, id); err != nil || h.State != region.Expired {
			t.Errorf("hold %s: %s, %v; want expired by the sweeper", id, h.State, err)
		}
	}
	e.checkPool(testSale, testSKU, counts{10, 0, 0})
}
