package region_test

import (
	"errors"
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
)

// holdStep is one operation on a test's hold and what must follow from it.
type holdStep struct {
	do      string        // confirm | release | advance | sweep
	payment string        // confirm: the payment id
	by      time.Duration // advance: how far to move the clock

	wantErr   error            // release/confirm: the error class, nil for success
	wantSold  bool             // confirm: the answer
	wantPay   string           // confirm: the payment the returned hold is sold to ("" when none)
	wantSwept int              // sweep: how many holds it expired
	wantState region.HoldState // the stored state of the hold after the step
	wantLate  int              // late_payments rows for the hold after the step
	want      counts           // the pool after the step
}

func TestHoldTransitions(t *testing.T) {
	const units, q = 10, 2
	reserved := counts{units - q, q, 0}
	sold := counts{units - q, 0, q}
	back := counts{units, 0, 0}

	confirm := func(p string, wantSold bool, state region.HoldState, late int, want counts) holdStep {
		pay := ""
		if state == region.Sold {
			pay = "pay-1"
		}
		return holdStep{do: "confirm", payment: p, wantSold: wantSold, wantPay: pay, wantState: state, wantLate: late, want: want}
	}
	release := func(wantErr error, state region.HoldState, late int, want counts) holdStep {
		return holdStep{do: "release", wantErr: wantErr, wantState: state, wantLate: late, want: want}
	}
	advance := func(by time.Duration) holdStep {
		return holdStep{do: "advance", by: by} // expectations carried over from the step before
	}
	sweep := func(n int, state region.HoldState, late int, want counts) holdStep {
		return holdStep{do: "sweep", wantSwept: n, wantState: state, wantLate: late, want: want}
	}

	cases := []struct {
		name  string
		steps []holdStep
	}{
		{"reserve then confirm sells", []holdStep{
			confirm("pay-1", true, region.Sold, 0, sold)}},
		{"reserve then release returns the units", []holdStep{
			release(nil, region.Released, 0, back)}},
		{"reserve then expire by the sweeper", []holdStep{
			sweep(0, region.Held, 0, reserved), // not yet due
			advance(testTTL),
			sweep(1, region.Expired, 0, back),
			sweep(0, region.Expired, 0, back)}},
		{"confirm just before the deadline sells", []holdStep{
			advance(testTTL - time.Millisecond),
			confirm("pay-1", true, region.Sold, 0, sold),
			advance(time.Hour),
			sweep(0, region.Sold, 0, sold)}},
		{"confirm after release refunds", []holdStep{
			release(nil, region.Released, 0, back),
			confirm("pay-1", false, region.Released, 1, back),
			confirm("pay-1", false, region.Released, 1, back)}}, // retried late payment: still one record
		{"confirm after expiry refunds", []holdStep{
			advance(testTTL + time.Second),
			sweep(1, region.Expired, 0, back),
			confirm("pay-1", false, region.Expired, 1, back)}},
		{"confirm at exactly the deadline refunds and expires the hold", []holdStep{
			advance(testTTL),
			confirm("pay-1", false, region.Expired, 1, back),
			sweep(0, region.Expired, 1, back)}},
		{"confirm past the deadline before any sweep refunds", []holdStep{
			advance(testTTL + time.Minute),
			confirm("pay-1", false, region.Expired, 1, back),
			release(nil, region.Expired, 1, back),
			sweep(0, region.Expired, 1, back)}},
		{"release after sold is a conflict", []holdStep{
			confirm("pay-1", true, region.Sold, 0, sold),
			release(region.ErrConflict, region.Sold, 0, sold)}},
		{"double confirm with the same payment is idempotent", []holdStep{
			confirm("pay-1", true, region.Sold, 0, sold),
			confirm("pay-1", true, region.Sold, 0, sold),
			advance(testTTL + time.Hour), // still the same answer after the deadline
			confirm("pay-1", true, region.Sold, 0, sold)}},
		{"confirm with another payment after sold refunds it", []holdStep{
			confirm("pay-1", true, region.Sold, 0, sold),
			confirm("pay-2", false, region.Sold, 1, sold),
			confirm("pay-1", true, region.Sold, 1, sold)}},
		{"release twice is idempotent", []holdStep{
			release(nil, region.Released, 0, back),
			release(nil, region.Released, 0, back),
			advance(testTTL + time.Hour),
			sweep(0, region.Released, 0, back)}},
		{"release after expiry keeps it expired", []holdStep{
			advance(testTTL),
			sweep(1, region.Expired, 0, back),
			release(nil, region.Expired, 0, back)}},
		{"release past the deadline before the sweep releases once", []holdStep{
			advance(testTTL + time.Second),
			release(nil, region.Released, 0, back),
			sweep(0, region.Released, 0, back),
			confirm("pay-1", false, region.Released, 1, back)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.sale(defaultTerms(testSale, 5), units)
			h := e.mustReserve("alice", "k1", q)
			if h.State != region.Held || h.Quantity != q || h.User != "alice" || h.Region != "us" {
				t.Fatalf("reserve returned %+v", h)
			}
			if !h.ExpiresAt.Equal(t0.Add(testTTL)) {
				t.Fatalf("hold expires at %s, want %s", h.ExpiresAt, t0.Add(testTTL))
			}
			e.checkPool(testSale, testSKU, reserved)
			prev := holdStep{wantState: region.Held, want: reserved}
			for i, s := range tc.steps {
				if s.do == "advance" {
					s.wantState, s.wantLate, s.want = prev.wantState, prev.wantLate, prev.want
				}
				prev = s
				switch s.do {
				case "confirm":
					res, err := e.r.Confirm(e.ctx, h.ID, s.payment)
					if err != nil {
						t.Fatalf("step %d confirm(%s): %v", i, s.payment, err)
					}
					if res.Sold != s.wantSold || res.Hold.ID != h.ID || res.Hold.State != s.wantState || res.Hold.PaymentID != s.wantPay {
						t.Errorf("step %d confirm(%s) = sold %v, hold %s state %s payment %q; want sold %v state %s payment %q",
							i, s.payment, res.Sold, res.Hold.ID, res.Hold.State, res.Hold.PaymentID, s.wantSold, s.wantState, s.wantPay)
					}
					if !res.Sold && res.Reason == "" {
						t.Errorf("step %d: a refund answer carries no reason", i)
					}
				case "release":
					got, err := e.r.Release(e.ctx, h.ID)
					if !errors.Is(err, s.wantErr) || (s.wantErr == nil && err != nil) {
						t.Fatalf("step %d release: %v, want %v", i, err, s.wantErr)
					}
					if err == nil && (got.ID != h.ID || got.State != s.wantState) {
						t.Errorf("step %d release returned %s in state %s, want state %s", i, got.ID, got.State, s.wantState)
					}
				case "advance":
					e.clk.Advance(s.by)
				case "sweep":
					n, err := e.r.SweepNow(e.ctx)
					if err != nil {
						t.Fatalf("step %d sweep: %v", i, err)
					}
					if n != s.wantSwept {
						t.Errorf("step %d sweep expired %d holds, want %d", i, n, s.wantSwept)
					}
				default:
					t.Fatalf("bad step %q", s.do)
				}
				stored, err := e.r.GetReservation(e.ctx, h.ID)
				if err != nil {
					t.Fatalf("step %d get: %v", i, err)
				}
				if stored.State != s.wantState {
					t.Errorf("step %d (%s): stored state %s, want %s", i, s.do, stored.State, s.wantState)
				}
				if (stored.State == region.Sold) != (stored.PaymentID != "") {
					t.Errorf("step %d: stored hold state %s with payment %q", i, stored.State, stored.PaymentID)
				}
				if n := count(t, e.pool, `SELECT count(*) FROM late_payments WHERE hold_id = $1`, h.ID); n != s.wantLate {
					t.Errorf("step %d (%s): %d late payments, want %d", i, s.do, n, s.wantLate)
				}
				e.checkPool(testSale, testSKU, s.want)
			}
			// No transition writes a second hold row.
			if n := count(t, e.pool, `SELECT count(*) FROM holds`); n != 1 {
				t.Errorf("%d hold rows, want 1", n)
			}
		})
	}
}

// TestClosedHoldFreesUserLimit checks the per-user count follows the hold's transitions: a
// released or expired hold no longer counts against the limit, a sold one still does.
func TestClosedHoldFreesUserLimit(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 2), 100)
	a := e.mustReserve("u", "a", 2)
	if _, err := e.reserve("u", "b", 1); !errors.Is(err, region.ErrLimitExceeded) {
		t.Fatalf("reserve over the limit: %v, want ErrLimitExceeded", err)
	}
	if _, err := e.r.Release(e.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	b := e.mustReserve("u", "b", 1)
	c := e.mustReserve("u", "c", 1)
	e.clk.Advance(testTTL)
	if n, err := e.r.SweepNow(e.ctx); err != nil || n != 2 {
		t.Fatalf("sweep: %d, %v; want 2 expired", n, err)
	}
	d := e.mustReserve("u", "d", 2)
	if res, err := e.r.Confirm(e.ctx, d.ID, "pay-d"); err != nil || !res.Sold {
		t.Fatalf("confirm: %+v, %v", res, err)
	}
	if _, err := e.reserve("u", "e", 1); !errors.Is(err, region.ErrLimitExceeded) {
		t.Fatalf("reserve after buying the limit: %v, want ErrLimitExceeded", err)
	}
	_, _ = b, c
	e.checkPool(testSale, testSKU, counts{98, 0, 2})
}
