package region

import (
	"container/heap"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// take records a new hold: available → held in its pool, the user's held count up. The
// caller has checked both conditions (I1, I2, I3).
func (b *batch) take(h *memHold) {
	pk, uk, q := poolKey{h.Sale, h.SKU}, userKey{h.Sale, h.SKU, h.User}, h.Quantity
	p := b.m.pools[pk]
	if p == nil || p.available < q {
		panic(fmt.Sprintf("region: take %d from pool %+v", q, p)) // the caller checked: a programmer error
	}
	p.available -= q
	p.held += q
	u := b.m.users[uk]
	if u == nil {
		u = &memUser{}
		b.m.users[uk] = u
	}
	u.held += q
	d := b.w.pool(pk)
	d.available -= q
	d.held += q
	b.w.newHolds = append(b.w.newHolds, h)
	b.m.keysPer[saleUser{h.Sale, h.User}]++
	b.put(h)
	heap.Push(&b.m.due, dueHold{h.ExpiresAt, h.ID})
	b.touched[pk] = p.available
}

// closeHold moves a held hold to sold, released or expired, exactly once, and returns its new
// version. held → sold keeps the units in the pool (I1, I3: held → sold) and moves the user's
// count to bought; held → released|expired returns them to available and frees the user's
// count. I5: only a held hold can close, so each happens at most once and never two of them;
// in SQL the update is guarded on state = 'held' as well.
func (b *batch) closeHold(h *memHold, to HoldState, payment string) *memHold {
	if h.State != Held {
		panic(fmt.Sprintf("region: close hold %s from %s", h.ID, h.State)) // callers check: a programmer error
	}
	pk, uk, q := poolKey{h.Sale, h.SKU}, userKey{h.Sale, h.SKU, h.User}, h.Quantity
	p, u := b.m.pools[pk], b.m.users[uk]
	if p == nil || u == nil || p.held < q || u.held < q {
		panic(fmt.Sprintf("region: close hold %s: pool %+v, user %+v", h.ID, p, u))
	}
	p.held -= q
	u.held -= q
	d := b.w.pool(pk)
	d.held -= q
	if to == Sold {
		p.sold += q
		u.bought += q
		d.sold += q
	} else {
		p.available += q
		d.available += q
	}
	nh := &memHold{Hold: h.Hold, hash: h.hash}
	nh.State = to
	if to == Sold {
		nh.PaymentID = payment
	}
	b.put(nh)
	b.w.closes = append(b.w.closes, closeRec{id: h.ID, state: string(to), payment: nh.PaymentID})
	b.touched[pk] = p.available
	return nh
}

func readHold(ctx context.Context, q rowQuerier, region, id string) (Hold, error) {
	h, err := scanHold(q.QueryRow(ctx, `SELECT `+holdColumns+` FROM holds WHERE hold_id = $1`, id), region)
	if err == pgx.ErrNoRows {
		return Hold{}, fmt.Errorf("hold_id %q: %w", id, ErrNotFound)
	}
	return h, err
}

type confirmOp struct {
	holdID, payment, region string
	stored                  *memHold // the hold as read from SQL, when memory has retired it
}

// apply is the guarded transition held → sold, taken only while the hold is held and
// unexpired at the batch's decision time (I6: no Confirm turns an expired or released hold
// into a sale). A payment that comes too late is answered "refund" and recorded in
// late_payments; a hold found held past its deadline is expired on the spot.
func (o *confirmOp) apply(_ context.Context, b *batch) (any, error, error) {
	h, fatal := b.holdOrStored(o.holdID, o.stored)
	if h == nil || fatal != nil {
		return nil, fmt.Errorf("hold_id %q: %w", o.holdID, errHoldNotInMemory), fatal
	}
	switch {
	case h.State == Sold && h.PaymentID == o.payment:
		return ConfirmResult{Sold: true, Hold: h.Hold}, nil, nil
	case h.State == Held && b.now.Before(h.ExpiresAt):
		return ConfirmResult{Sold: true, Hold: b.closeHold(h, Sold, o.payment).Hold}, nil, nil
	case h.State == Held:
		h = b.closeHold(h, Expired, "")
	}
	reason := fmt.Sprintf("hold is %s: refund the payment", h.State)
	if h.State == Sold {
		reason = fmt.Sprintf("hold was sold to payment %s: refund this one", h.PaymentID)
	}
	b.w.late = append(b.w.late, lateRec{hold: h.ID, payment: o.payment, state: string(h.State)})
	return ConfirmResult{Sold: false, Hold: h.Hold, Reason: reason}, nil, nil
}

type releaseOp struct {
	holdID, region string
	stored         *memHold // the hold as read from SQL, when memory has retired it
}

// apply is the guarded transition held → released. Releasing a hold that is already
// released or expired returns it unchanged (idempotent; its units came back once, I5);
// releasing a sold hold is a conflict.
func (o *releaseOp) apply(_ context.Context, b *batch) (any, error, error) {
	h, fatal := b.holdOrStored(o.holdID, o.stored)
	if h == nil || fatal != nil {
		return nil, fmt.Errorf("hold_id %q: %w", o.holdID, errHoldNotInMemory), fatal
	}
	switch h.State {
	case Sold:
		return nil, fmt.Errorf("hold_id %q is sold (payment %s): %w", h.ID, h.PaymentID, ErrConflict), nil
	case Released, Expired:
		return h.Hold, nil, nil
	}
	return b.closeHold(h, Released, "").Hold, nil, nil
}

type expireOp struct {
	limit  int
	region string
}

// apply expires up to limit holds whose deadline has passed at the batch's decision time,
// earliest first. Entries of holds closed since they were queued are skipped, so units come
// back once (I5).
func (o *expireOp) apply(_ context.Context, b *batch) (any, error, error) {
	n := 0
	for n < o.limit && b.m.due.Len() > 0 && !b.now.Before(b.m.due[0].at) {
		d := heap.Pop(&b.m.due).(dueHold)
		if h := b.hold(d.id); h != nil && h.State == Held && !b.now.Before(h.ExpiresAt) {
			b.closeHold(h, Expired, "")
			n++
		}
	}
	return n, nil, nil
}
