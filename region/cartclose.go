package region

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/quotaworks/quota/internal/apierr"
)

// Confirm records payment for a whole cart: every line held and unexpired → every line
// sold to the payment, in one writer step; otherwise no line is sold and the result says
// refund (the lines' deadlines are one, so they pass together), the payment recorded for
// reconciliation against each line. Idempotent on (cart, payment).
func (c Carts) Confirm(ctx context.Context, cartID, paymentID string) (CartCloseResult, error) {
	r := c.R
	if err := checkCartID(r.cfg.Name, cartID); err != nil {
		return CartCloseResult{}, err
	}
	if err := checkIDs("payment_id", paymentID); err != nil {
		return CartCloseResult{}, err
	}
	return confirmBound(ctx, r, func(checked bool) (CartCloseResult, error) {
		return submitForCart(ctx, r, cartID, func(ids []string, stored map[string]*memHold) op[CartCloseResult] {
			return &cartCloseOp{cart: cartID, ids: ids, payment: paymentID, stored: stored, binds: r.binds, checked: checked}
		})
	})
}

// Release gives every held line of a cart back, in one writer step; idempotent. A sold cart
// is a conflict.
func (c Carts) Release(ctx context.Context, cartID string) (CartCloseResult, error) {
	r := c.R
	if err := checkCartID(r.cfg.Name, cartID); err != nil {
		return CartCloseResult{}, err
	}
	return submitForCart(ctx, r, cartID, func(ids []string, stored map[string]*memHold) op[CartCloseResult] {
		return &cartCloseOp{cart: cartID, ids: ids, release: true, stored: stored}
	})
}

// Get reads a cart's holds as committed, archived ones included, in line order.
func (c Carts) Get(ctx context.Context, cartID string) (CartCloseResult, error) {
	r := c.R
	if err := checkCartID(r.cfg.Name, cartID); err != nil {
		return CartCloseResult{}, err
	}
	hs, err := readCart(ctx, r.pool, r.cfg.Name, cartID)
	if err != nil {
		return CartCloseResult{}, err
	}
	return CartCloseResult{CartID: cartID, Holds: hs}, nil
}

// checkCartID is checkHoldID for a cart id (line 0's hold id), naming the field cart_id.
func checkCartID(region, id string) error {
	err := checkHoldID(region, id)
	var inv *apierr.InvalidError
	if errors.As(err, &inv) {
		return apierr.Invalid("cart_id", "%s", strings.ReplaceAll(inv.Reason, "hold id", "cart id"))
	}
	return err
}

// submitForCart reads the cart's lines from SQL (NOT_FOUND when it has none) and submits the
// op mk makes for them; when the writer no longer has every line in memory, they are passed
// as stored and the op is submitted again (submitForHold).
func submitForCart(ctx context.Context, r *Region, cartID string, mk func(ids []string, stored map[string]*memHold) op[CartCloseResult]) (CartCloseResult, error) {
	hs, err := readCart(ctx, r.pool, r.cfg.Name, cartID)
	if err != nil {
		return CartCloseResult{}, err
	}
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.ID
	}
	res, err := submitOp[CartCloseResult](ctx, r.leadership, mk(ids, nil))
	if !errors.Is(err, errHoldNotInMemory) {
		return res, err
	}
	if hs, err = readCart(ctx, r.pool, r.cfg.Name, cartID); err != nil {
		return CartCloseResult{}, err
	}
	stored := make(map[string]*memHold, len(hs))
	for _, h := range hs {
		stored[h.ID] = &memHold{Hold: h}
	}
	return submitOp[CartCloseResult](ctx, r.leadership, mk(ids, stored))
}

// readCart reads a cart's holds as committed, from holds and the archive, in line order.
func readCart(ctx context.Context, q pgxQuerier, region, cartID string) ([]Hold, error) {
	rows, err := q.Query(ctx, `SELECT `+holdColumns+` FROM holds WHERE cart_id = $1
		UNION ALL SELECT `+holdColumns+` FROM holds_closed WHERE cart_id = $1 LIMIT $2`, cartID, MaxCartLines+1)
	if err != nil {
		return nil, fmt.Errorf("read cart %s: %w", cartID, err)
	}
	defer rows.Close()
	var hs []Hold
	for rows.Next() {
		h, err := scanHold(rows, region)
		if err != nil {
			return nil, fmt.Errorf("read cart %s: %w", cartID, err)
		}
		hs = append(hs, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read cart %s: %w", cartID, err)
	}
	if len(hs) == 0 {
		return nil, apierr.NotFound("cart_id", cartID)
	}
	sortLines(hs)
	return hs, nil
}

// sortLines orders a cart's holds by line.
func sortLines(hs []Hold) {
	slices.SortFunc(hs, func(a, b Hold) int { return lineIndex(a.RequestKey) - lineIndex(b.RequestKey) })
}

// cartCloseOp confirms (payment) or releases (release) the cart whose lines are ids, as one
// step: every line or none (I10).
type cartCloseOp struct {
	cart    string
	ids     []string
	payment string
	release bool
	stored  map[string]*memHold // the lines as read from SQL, when memory has retired one
	// binds and checked are the binding guard's (bindings.confirmable), for a confirm.
	binds   *bindings
	checked bool
}

func (o *cartCloseOp) apply(_ context.Context, b *batch) (CartCloseResult, error, error) {
	if len(o.ids) == 0 {
		return CartCloseResult{}, apierr.NotFound("cart_id", o.cart), nil
	}
	hs := make([]*memHold, len(o.ids))
	for i, id := range o.ids {
		h, fatal := b.holdOrStored(id, o.stored[id])
		if fatal != nil {
			return CartCloseResult{}, nil, fatal
		}
		if h == nil {
			return CartCloseResult{}, fmt.Errorf("hold_id %q: %w", id, errHoldNotInMemory), nil
		}
		hs[i] = h
	}
	if o.release {
		return o.releaseAll(b, hs)
	}
	if err := o.binds.confirmable(hs[0], b.now, o.checked); err != nil {
		return CartCloseResult{}, err, nil // one buyer's lines: line 0 speaks for all; nothing changed
	}
	return o.confirmAll(b, hs), nil, nil
}

// confirmAll sells every line when every line is held and unexpired (I5, I6 for each), or
// none: the payment is then refunded, recorded as late against each line, and the lines
// found held past their deadline expire on the spot, as confirmOp does for one hold.
func (o *cartCloseOp) confirmAll(b *batch, hs []*memHold) CartCloseResult {
	sold, sellable := true, true
	for _, h := range hs {
		sold = sold && h.State == Sold && h.PaymentID == o.payment
		sellable = sellable && h.State == Held && b.now.Before(h.ExpiresAt)
	}
	switch {
	case sold:
		return o.result(hs, true, "")
	case sellable:
		for i, h := range hs {
			hs[i] = b.closeHold(h, Sold, o.payment)
		}
		return o.result(hs, true, "")
	}
	states := make([]string, len(hs))
	for i, h := range hs {
		if h.State == Held && !b.now.Before(h.ExpiresAt) {
			hs[i] = b.closeHold(h, Expired, "")
		}
		states[i] = string(hs[i].State)
		if hs[i].State == Sold {
			states[i] += " to payment " + hs[i].PaymentID
		}
		b.w.late = append(b.w.late, lateRec{hold: h.ID, payment: o.payment, state: string(hs[i].State)})
	}
	return o.result(hs, false, fmt.Sprintf("cart's lines are %s: refund the payment", strings.Join(states, ", ")))
}

// releaseAll releases every held line; released or expired lines stay as they are
// (idempotent); a cart with a sold line is a conflict and nothing changes.
func (o *cartCloseOp) releaseAll(b *batch, hs []*memHold) (CartCloseResult, error, error) {
	for _, h := range hs {
		if h.State == Sold {
			return CartCloseResult{}, fmt.Errorf("cart_id %q is sold (payment %s): %w", o.cart, h.PaymentID, ErrConflict), nil
		}
	}
	for i, h := range hs {
		if h.State == Held {
			hs[i] = b.closeHold(h, Released, "")
		}
	}
	return o.result(hs, false, ""), nil, nil
}

func (o *cartCloseOp) result(hs []*memHold, sold bool, reason string) CartCloseResult {
	res := CartCloseResult{CartID: o.cart, Holds: make([]Hold, len(hs)), Sold: sold, Reason: reason}
	for i, h := range hs {
		res.Holds[i] = h.Hold
	}
	return res
}

// lineAlone is the answer to a confirm or release of one line of a cart by its hold id: the
// cart is bought or given back whole (I10).
func lineAlone(h *memHold) error {
	return fmt.Errorf("hold_id %q is a line of cart %s: confirm or release the cart: %w", h.ID, h.CartID, ErrConflict)
}
