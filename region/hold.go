package region

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
)

// Confirm records payment for a hold: held and unexpired → sold; otherwise the result says
// refund and the payment is recorded for reconciliation. Idempotent on (hold, payment).
func (r *Region) Confirm(ctx context.Context, holdID, paymentID string) (ConfirmResult, error) {
	if err := checkHoldID(r.cfg.Name, holdID); err != nil {
		return ConfirmResult{}, err
	}
	if err := checkIDs("payment_id", paymentID); err != nil {
		return ConfirmResult{}, err
	}
	return confirmBound(ctx, r, func(checked bool) (ConfirmResult, error) {
		return submitForHold[ConfirmResult](ctx, r, holdID, func(stored *memHold) op[ConfirmResult] {
			return &confirmOp{holdID: holdID, payment: paymentID, region: r.cfg.Name, stored: stored, binds: r.binds, checked: checked}
		})
	})
}

// checkHoldID checks that id is a hold id of this region (named region).
func checkHoldID(region, id string) error {
	if err := checkIDs("hold_id", id); err != nil {
		return err
	}
	owner, _, found := strings.Cut(id, ".")
	if !found || owner == "" {
		return apierr.Invalid("hold_id", "%q is not a hold id: hold ids start with their region's name and a dot (%s.…)", id, region)
	}
	if owner != region {
		return fmt.Errorf("hold_id %q belongs to region %q, not %s: %w", id, owner, region, ErrNotFound)
	}
	if suffix := id[len(owner)+1:]; !isHoldSuffix(suffix) {
		return apierr.Invalid("hold_id", "%q is not a hold id: after %q come 28 lowercase hex digits (24 in holds made by older versions), not %q", id, owner+".", suffix)
	}
	return nil
}

// isHoldSuffix tells whether s can follow "<region>." in a hold id: 28 lowercase hex digits
// (newHoldID), or 24 for holds made before ids led with the clock.
func isHoldSuffix(s string) bool {
	if len(s) != 28 && len(s) != 24 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// submitForHold submits the op mk makes for a hold. When the writer does not have the hold in
// memory (it may be closed and retired), the hold is read from SQL (NOT_FOUND if it is not
// there either) and the op is submitted again with it, to be decided on the stored hold.
func submitForHold[T any](ctx context.Context, r *Region, holdID string, mk func(stored *memHold) op[T]) (T, error) {
	res, err := submitOp[T](ctx, r.leadership, mk(nil))
	if !errors.Is(err, errHoldNotInMemory) {
		return res, err
	}
	h, err := readHold(ctx, r.pool, r.cfg.Name, holdID)
	if err != nil {
		return res, err
	}
	return submitOp[T](ctx, r.leadership, mk(&memHold{Hold: h}))
}

// readHold reads a hold as committed, from holds or the archive (holds_closed).
func readHold(ctx context.Context, q rowQuerier, region, id string) (Hold, error) {
	h, err := scanHold(q.QueryRow(ctx, `SELECT `+holdColumns+` FROM holds WHERE hold_id = $1
		UNION ALL SELECT `+holdColumns+` FROM holds_closed WHERE hold_id = $1 LIMIT 1`, id), region)
	if err == pgx.ErrNoRows {
		return Hold{}, fmt.Errorf("hold_id %q: %w", id, ErrNotFound)
	}
	return h, err
}

type confirmOp struct {
	holdID, payment, region string
	stored                  *memHold // the hold as read from SQL, when memory has retired it
	// binds and checked are the binding guard's (bindings.confirmable).
	binds   *bindings
	checked bool
}

// apply is the guarded transition held → sold, taken only while the hold is held and
// unexpired at the batch's decision time (I6: no Confirm turns an expired or released hold
// into a sale), and only for a buyer bound to this region (bindings.confirmable: the
// per-user limit across regions). A payment that comes too late is answered "refund" and recorded in
// late_payments; a hold found held past its deadline is expired on the spot.
func (o *confirmOp) apply(_ context.Context, b *batch) (ConfirmResult, error, error) {
	h, fatal := b.holdOrStored(o.holdID, o.stored)
	if h == nil || fatal != nil {
		return ConfirmResult{}, fmt.Errorf("hold_id %q: %w", o.holdID, errHoldNotInMemory), fatal
	}
	if h.CartID != "" {
		return ConfirmResult{}, lineAlone(h), nil
	}
	if err := o.binds.confirmable(h, b.now, o.checked); err != nil {
		return ConfirmResult{}, err, nil // the per-user limit across regions: nothing changed
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

// holdOrStored returns the hold id as this batch sees it, or else stored, the hold as read
// from SQL after memory missed it. A stored hold must be closed: one held in SQL but not in
// memory means a newer leader made it (this one is deposed) or memory is wrong, so the batch
// fails, and the leader reloads or, fenced, stops.
func (b *batch) holdOrStored(id string, stored *memHold) (*memHold, error) {
	if h := b.hold(id); h != nil {
		return h, nil
	}
	if stored != nil && stored.State == Held {
		return nil, fmt.Errorf("hold %s is held in the database but not in the leader's memory", id)
	}
	return stored, nil
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
		b.setAsideReturned(pk, q)
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

// Release gives a held hold's units back; idempotent.
func (r *Region) Release(ctx context.Context, holdID string) (Hold, error) {
	if err := checkHoldID(r.cfg.Name, holdID); err != nil {
		return Hold{}, err
	}
	return submitForHold[Hold](ctx, r, holdID, func(stored *memHold) op[Hold] {
		return &releaseOp{holdID: holdID, region: r.cfg.Name, stored: stored}
	})
}

type releaseOp struct {
	holdID, region string
	stored         *memHold // the hold as read from SQL, when memory has retired it
}

// apply is the guarded transition held → released. Releasing a hold that is already
// released or expired returns it unchanged (idempotent; its units came back once, I5);
// releasing a sold hold is a conflict.
func (o *releaseOp) apply(_ context.Context, b *batch) (Hold, error, error) {
	h, fatal := b.holdOrStored(o.holdID, o.stored)
	if h == nil || fatal != nil {
		return Hold{}, fmt.Errorf("hold_id %q: %w", o.holdID, errHoldNotInMemory), fatal
	}
	if h.CartID != "" {
		return Hold{}, lineAlone(h), nil
	}
	switch h.State {
	case Sold:
		return Hold{}, fmt.Errorf("hold_id %q is sold (payment %s): %w", h.ID, h.PaymentID, ErrConflict), nil
	case Released, Expired:
		return h.Hold, nil, nil
	}
	return b.closeHold(h, Released, "").Hold, nil, nil
}

// GetReservation reads a hold as committed, archived ones included.
func (r *Region) GetReservation(ctx context.Context, holdID string) (Hold, error) {
	if err := checkHoldID(r.cfg.Name, holdID); err != nil {
		return Hold{}, err
	}
	return readHold(ctx, r.pool, r.cfg.Name, holdID)
}

type expireOp struct {
	limit  int
	region string
}

// apply expires up to limit holds whose deadline has passed at the batch's decision time,
// earliest first. Entries of holds closed since they were queued are skipped, so units come
// back once (I5).
func (o *expireOp) apply(_ context.Context, b *batch) (int, error, error) {
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

// Bounds of BuyerHolds' limit: DefaultBuyerHolds when the caller gives none, at most
// MaxBuyerHolds.
const (
	DefaultBuyerHolds = 100
	MaxBuyerHolds     = 1000
)

// BuyerHolds reads the buyer's holds of a sale at this region as committed, open and closed
// (archived ones included), newest first, at most limit of them (0: DefaultBuyerHolds);
// truncated says the buyer has more. It reads through the indexes of the holds' idempotency
// keys, (sale_id, user_id, request_key), and changes nothing.
func (r *Region) BuyerHolds(ctx context.Context, sale, user string, limit int) (holds []Hold, truncated bool, err error) {
	if err := checkIDs("sale_id", sale, "user_id", user); err != nil {
		return nil, false, err
	}
	if limit == 0 {
		limit = DefaultBuyerHolds
	}
	if limit < 1 || limit > MaxBuyerHolds {
		return nil, false, apierr.Invalid("limit", "must be 1..%d, got %d", MaxBuyerHolds, limit)
	}
	rows, err := r.pool.Query(ctx, `SELECT * FROM (
		SELECT `+holdColumns+` FROM holds WHERE sale_id = $1 AND user_id = $2
		UNION ALL SELECT `+holdColumns+` FROM holds_closed WHERE sale_id = $1 AND user_id = $2) h
		ORDER BY created_at DESC, hold_id DESC LIMIT $3`, sale, user, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("read holds of buyer %s in sale %s: %w", user, sale, err)
	}
	defer rows.Close()
	for rows.Next() {
		h, err := scanHold(rows, r.cfg.Name)
		if err != nil {
			return nil, false, fmt.Errorf("read holds of buyer %s in sale %s: %w", user, sale, err)
		}
		holds = append(holds, h)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("read holds of buyer %s in sale %s: %w", user, sale, err)
	}
	if len(holds) > limit {
		return holds[:limit], true, nil
	}
	return holds, false, nil
}
