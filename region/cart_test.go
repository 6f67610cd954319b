package region_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

const (
	phone = "phone"
	cases = "case"
)

// cartEnv is a region with a sale of phones and cases, 5 of each, per-user limit 2.
func cartEnv(t *testing.T, opts ...func(*region.Config)) *env {
	e := newEnv(t, opts...)
	e.sale(defaultTerms(testSale, 2, phone, cases), 5)
	return e
}

func (e *env) cart(user, key string, lines ...region.CartLine) (region.CartResult, error) {
	return e.carts().Reserve(e.ctx, region.CartRequest{Sale: testSale, User: user, RequestKey: key, Lines: lines})
}

func line(sku string, q transfer.Units) region.CartLine {
	return region.CartLine{SKU: sku, Quantity: q}
}

// buyerHolds counts a buyer's hold rows.
func (e *env) buyerHolds(user string) int {
	return count(e.t, e.pool, `SELECT count(*) FROM holds WHERE user_id = $1`, user)
}

// TestCartAllOrNothing checks I10 for each reason a cart's second line is refused: the cart
// is refused with that line's reason, index and SKU, and its first line, which alone would
// be granted, is not held (its pool and the buyer's counts unchanged, no row written).
func TestCartAllOrNothing(t *testing.T) {
	var soldOut atomic.Bool
	for _, tc := range []struct {
		name  string
		setup func(e *env)
		want  error
	}{
		{"region exhausted", func(e *env) {
			for i := range 5 {
				e.mustCart(fmt.Sprintf("other%d", i), "k", line(cases, 1))
			}
		}, region.ErrRegionExhausted},
		{"sold out", func(e *env) {
			for i := range 5 {
				e.mustCart(fmt.Sprintf("other%d", i), "k", line(cases, 1))
			}
			soldOut.Store(true)
		}, region.ErrSoldOut},
		{"limit exceeded", func(e *env) { e.mustCart("bob", "earlier", line(cases, 2)) }, region.ErrLimitExceeded},
		{"paused", func(e *env) {
			if _, err := e.r.SetPaused(e.ctx, region.PauseRequest{Generation: 1, Sale: testSale, SKU: cases, Paused: true, Version: 1}); err != nil {
				t.Fatal(err)
			}
		}, region.ErrPaused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			soldOut.Store(false)
			e := cartEnv(t, func(c *region.Config) {
				c.Cluster.SoldOut = func(sale, sku string) bool { return soldOut.Load() && sku == cases }
			})
			tc.setup(e)
			before, rows := stock(t, e.r, testSale, phone), e.buyerHolds("bob")
			_, err := e.cart("bob", "cart1", line(phone, 1), line(cases, 1))
			var ce *region.CartError
			if !errors.Is(err, tc.want) || !errors.As(err, &ce) || len(ce.Lines) != 1 || ce.Lines[0].Line != 1 || ce.Lines[0].SKU != cases {
				t.Fatalf("cart: %v; want %v on lines[1] (case) alone", err, tc.want)
			}
			if got := stock(t, e.r, testSale, phone); got != before {
				t.Errorf("phone pool %+v after a refused cart; want %+v unchanged", got, before)
			}
			if n := e.buyerHolds("bob"); n != rows {
				t.Errorf("bob has %d hold rows after a refused cart; want %d", n, rows)
			}
			if err := checkBooks(e.ctx, e.pool, testSale); err != nil {
				t.Error(err)
			}
			// The refusal took nothing from the buyer's allowance: a phone alone is still
			// granted up to the limit.
			e.mustCart("bob", "phones", line(phone, 2))
		})
	}
}

func (e *env) mustCart(user, key string, lines ...region.CartLine) region.CartResult {
	e.t.Helper()
	res, err := e.cart(user, key, lines...)
	if err != nil {
		e.t.Fatalf("cart %s/%s: %v", user, key, err)
	}
	return res
}

// TestCartEveryLineRefused checks that a cart names every line refused, first one first.
func TestCartEveryLineRefused(t *testing.T) {
	e := cartEnv(t)
	e.mustCart("bob", "k0", line(phone, 2), line(cases, 2))
	_, err := e.cart("bob", "k1", line(phone, 1), line(cases, 1))
	var ce *region.CartError
	if !errors.As(err, &ce) || len(ce.Lines) != 2 || ce.Lines[0].Line != 0 || ce.Lines[1].Line != 1 || !errors.Is(err, region.ErrLimitExceeded) {
		t.Fatalf("a cart over the limit on both lines: %v; want LIMIT_EXCEEDED on lines[0] and lines[1]", err)
	}
}

// TestCartGrantedReplayedAndConflicting checks a granted cart (one hold per line, sharing
// the cart id, line 0's hold id), its replay by key before and after a takeover, and a
// reuse of its key for other lines (ALREADY_EXISTS, nothing taken).
func TestCartGrantedReplayedAndConflicting(t *testing.T) {
	e := cartEnv(t)
	res := e.mustCart("bob", "cart1", line(phone, 1), line(cases, 2))
	if len(res.Holds) != 2 || res.CartID != res.Holds[0].ID || res.Replayed {
		t.Fatalf("cart: %+v; want two holds, the cart id line 0's hold id", res)
	}
	for i, h := range res.Holds {
		key := fmt.Sprintf("cart1#%d", i)
		if i == 0 {
			key = "cart1" // line 0 keeps the cart's own key
		}
		if h.CartID != res.CartID || h.State != region.Held || h.RequestKey != key {
			t.Errorf("line %d: %+v; want held, in cart %s, key %s", i, h, res.CartID, key)
		}
	}
	e.checkPool(testSale, phone, counts{avail: 4, held: 1})
	e.checkPool(testSale, cases, counts{avail: 3, held: 2})
	replay := func(when string) {
		again, err := e.cart("bob", "cart1", line(phone, 1), line(cases, 2))
		if err != nil || !again.Replayed || again.CartID != res.CartID || len(again.Holds) != 2 ||
			again.Holds[0].ID != res.Holds[0].ID || again.Holds[1].ID != res.Holds[1].ID {
			t.Fatalf("retry %s: %+v %v; want the cart replayed", when, again, err)
		}
	}
	replay("at once")
	e.takeOver()
	replay("after a takeover")
	for _, other := range [][]region.CartLine{
		{line(phone, 1)},
		{line(phone, 1), line(cases, 1)},
		{line(cases, 2), line(phone, 1)},
	} {
		if _, err := e.cart("bob", "cart1", other...); !errors.Is(err, region.ErrAlreadyExists) {
			t.Errorf("cart1 again with %v: %v; want ALREADY_EXISTS", other, err)
		}
	}
	if got, err := e.carts().Get(e.ctx, res.CartID); err != nil || len(got.Holds) != 2 || got.Holds[1].ID != res.Holds[1].ID {
		t.Errorf("get cart: %+v %v", got, err)
	}
	e.checkPool(testSale, phone, counts{avail: 4, held: 1})
	e.checkPool(testSale, cases, counts{avail: 3, held: 2})
}

// TestCartConfirmAndRelease checks that a cart is confirmed or released whole, and its lines
// never alone: a confirm sells every line (again: the same answer), a line's own confirm or
// release is CONFLICT, a released or expired cart's confirm sells nothing and says refund.
func TestCartConfirmAndRelease(t *testing.T) {
	e := cartEnv(t)
	sold := e.mustCart("bob", "c1", line(phone, 1), line(cases, 1))
	for _, id := range []string{sold.Holds[0].ID, sold.Holds[1].ID} {
		if _, err := e.r.Confirm(e.ctx, id, "p0"); !errors.Is(err, region.ErrConflict) {
			t.Errorf("confirm line %s alone: %v; want CONFLICT", id, err)
		}
		if _, err := e.r.Release(e.ctx, id); !errors.Is(err, region.ErrConflict) {
			t.Errorf("release line %s alone: %v; want CONFLICT", id, err)
		}
	}
	for range 2 {
		res, err := e.carts().Confirm(e.ctx, sold.CartID, "p1")
		if err != nil || !res.Sold || len(res.Holds) != 2 || res.Holds[0].State != region.Sold || res.Holds[1].State != region.Sold {
			t.Fatalf("confirm cart: %+v %v; want both lines sold", res, err)
		}
	}
	if _, err := e.carts().Release(e.ctx, sold.CartID); !errors.Is(err, region.ErrConflict) {
		t.Errorf("release a sold cart: %v; want CONFLICT", err)
	}
	released := e.mustCart("carol", "c1", line(phone, 1), line(cases, 1))
	for range 2 {
		res, err := e.carts().Release(e.ctx, released.CartID)
		if err != nil || res.Holds[0].State != region.Released || res.Holds[1].State != region.Released {
			t.Fatalf("release cart: %+v %v; want both lines released", res, err)
		}
	}
	if res, err := e.carts().Confirm(e.ctx, released.CartID, "p2"); err != nil || res.Sold || !strings.Contains(res.Reason, "refund") {
		t.Errorf("confirm a released cart: %+v %v; want refund", res, err)
	}
	expired := e.mustCart("dave", "c1", line(phone, 1), line(cases, 1))
	e.clk.Advance(testTTL + time.Second)
	res, err := e.carts().Confirm(e.ctx, expired.CartID, "p3")
	if err != nil || res.Sold || res.Holds[0].State != region.Expired || res.Holds[1].State != region.Expired {
		t.Errorf("confirm an expired cart: %+v %v; want refund, both lines expired", res, err)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM late_payments WHERE payment_id IN ('p2', 'p3')`); n != 4 {
		t.Errorf("%d late payments recorded; want one per line of the two refunded carts (4)", n)
	}
	if _, err := e.carts().Confirm(e.ctx, "us.0123456789abcdef0123456789ab", "p4"); !errors.Is(err, region.ErrNotFound) {
		t.Errorf("confirm an unknown cart: %v; want NOT_FOUND", err)
	}
	e.checkPool(testSale, phone, counts{avail: 4, sold: 1})
	e.checkPool(testSale, cases, counts{avail: 4, sold: 1})
}

// TestCartBadInput checks that a malformed cart names its bad field and changes nothing.
func TestCartBadInput(t *testing.T) {
	e := cartEnv(t)
	many := make([]region.CartLine, region.MaxCartLines+1)
	for i := range many {
		many[i] = line(fmt.Sprintf("s%d", i), 1)
	}
	for _, tc := range []struct {
		key   string
		lines []region.CartLine
		field string
	}{
		{"k", nil, "lines"},
		{"k", many, "lines"},
		{"k", []region.CartLine{line(phone, 1), line(phone, 1)}, "lines[1].sku"},
		{"k", []region.CartLine{line(phone, 1), line("", 1)}, "lines[1].sku"},
		{"k", []region.CartLine{line(phone, 0)}, "lines[0].quantity"},
		{"k", []region.CartLine{line(phone, 3)}, "lines[0].quantity"}, // over the per-user limit
		{"k#0", []region.CartLine{line(phone, 1)}, "request_key"},
		{strings.Repeat("k", transfer.MaxIDLen-2), []region.CartLine{line(phone, 1)}, "request_key"},
	} {
		if _, err := e.cart("bob", tc.key, tc.lines...); fieldOf(err) != tc.field {
			t.Errorf("cart %q %v: %v; want INVALID_ARGUMENT naming %s", tc.key, tc.lines, err, tc.field)
		}
	}
	_, err := e.cart("bob", "k", line(phone, 1), line("tablet", 1))
	var le *apierr.LineError
	if !errors.Is(err, region.ErrNotFound) || !errors.As(err, &le) || le.Line != 1 {
		t.Errorf("a cart with an SKU not in the sale: %v; want NOT_FOUND on lines[1]", err)
	}
	if n := e.buyerHolds("bob"); n != 0 {
		t.Errorf("bad carts left %d holds", n)
	}
}

func (e *env) carts() region.Carts { return region.Carts{R: e.r} }
