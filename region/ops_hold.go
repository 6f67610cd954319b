package region

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// closeHold moves a held hold to sold, released or expired, exactly once: every statement
// is guarded on the hold still being held, and a guard that matches nothing fails the batch.
// held → sold preserves I1 and I3 (held → sold inside the pool); held → released|expired
// returns the units to available (I1, I3) and frees the user's count. I5: the guard on
// state = 'held' makes each of these happen at most once and never two of them.
func closeHold(ctx context.Context, tx pgx.Tx, b *batch, h Hold, to HoldState, payment string) error {
	q := int64(h.Quantity)
	wb := &pgx.Batch{}
	var pay any
	if to == Sold {
		pay = payment
	}
	wb.Queue(`UPDATE holds SET state = $2, payment_id = $3, closed_at = $4 WHERE hold_id = $1 AND state = 'held'`,
		h.ID, string(to), pay, b.now)
	if to == Sold {
		wb.Queue(`UPDATE pools SET held = held - $3, sold = sold + $3 WHERE sale_id = $1 AND sku = $2 AND held >= $3
			RETURNING available`, h.Sale, h.SKU, q)
		wb.Queue(`UPDATE user_counts SET held_qty = held_qty - $4, bought_qty = bought_qty + $4
			WHERE sale_id = $1 AND sku = $2 AND user_id = $3 AND held_qty >= $4`, h.Sale, h.SKU, h.User, q)
	} else {
		wb.Queue(`UPDATE pools SET held = held - $3, available = available + $3 WHERE sale_id = $1 AND sku = $2 AND held >= $3
			RETURNING available`, h.Sale, h.SKU, q)
		wb.Queue(`UPDATE user_counts SET held_qty = held_qty - $4
			WHERE sale_id = $1 AND sku = $2 AND user_id = $3 AND held_qty >= $4`, h.Sale, h.SKU, h.User, q)
	}
	res := tx.SendBatch(ctx, wb)
	defer res.Close()
	if tag, err := res.Exec(); err != nil || tag.RowsAffected() != 1 {
		return fmt.Errorf("close hold %s → %s: hold guard (err %v)", h.ID, to, err)
	}
	var avail int64
	if err := res.QueryRow().Scan(&avail); err != nil {
		return fmt.Errorf("close hold %s → %s: pool guard: %w", h.ID, to, err)
	}
	if tag, err := res.Exec(); err != nil || tag.RowsAffected() != 1 {
		return fmt.Errorf("close hold %s → %s: user guard (err %v)", h.ID, to, err)
	}
	b.touched[poolKey{h.Sale, h.SKU}] = transfer.Units(avail)
	return res.Close()
}

func readHold(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, region, id string) (Hold, error) {
	h, err := scanHold(q.QueryRow(ctx, `SELECT `+holdColumns+` FROM holds WHERE hold_id = $1`, id), region)
	if err == pgx.ErrNoRows {
		return Hold{}, fmt.Errorf("hold_id %q: %w", id, ErrNotFound)
	}
	return h, err
}

type confirmOp struct {
	holdID, payment, region string
}

// apply is the guarded transition held → sold, taken only while the hold is held and
// unexpired at the batch's decision time (I6: no Confirm turns an expired or released hold
// into a sale). A payment that comes too late is answered "refund" and recorded in
// late_payments; a hold found held past its deadline is expired on the spot.
func (o *confirmOp) apply(ctx context.Context, tx pgx.Tx, b *batch) (any, error, error) {
	h, err := readHold(ctx, tx, o.region, o.holdID)
	if err != nil {
		if isNotFound(err) {
			return nil, err, nil
		}
		return nil, nil, err
	}
	switch {
	case h.State == Sold && h.PaymentID == o.payment:
		return ConfirmResult{Sold: true, Hold: h}, nil, nil
	case h.State == Held && b.now.Before(h.ExpiresAt):
		if err := closeHold(ctx, tx, b, h, Sold, o.payment); err != nil {
			return nil, nil, err
		}
		h.State, h.PaymentID = Sold, o.payment
		return ConfirmResult{Sold: true, Hold: h}, nil, nil
	case h.State == Held:
		if err := closeHold(ctx, tx, b, h, Expired, ""); err != nil {
			return nil, nil, err
		}
		h.State = Expired
	}
	reason := fmt.Sprintf("hold is %s: refund the payment", h.State)
	if h.State == Sold {
		reason = fmt.Sprintf("hold was sold to payment %s: refund this one", h.PaymentID)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO late_payments (hold_id, payment_id, hold_state, received_at)
		VALUES ($1, $2, $3, $4) ON CONFLICT (hold_id, payment_id) DO NOTHING`, h.ID, o.payment, string(h.State), b.now); err != nil {
		return nil, nil, fmt.Errorf("record late payment: %w", err)
	}
	return ConfirmResult{Sold: false, Hold: h, Reason: reason}, nil, nil
}

type releaseOp struct {
	holdID, region string
}

// apply is the guarded transition held → released. Releasing a hold that is already
// released or expired returns it unchanged (idempotent; its units came back once, I5);
// releasing a sold hold is a conflict.
func (o *releaseOp) apply(ctx context.Context, tx pgx.Tx, b *batch) (any, error, error) {
	h, err := readHold(ctx, tx, o.region, o.holdID)
	if err != nil {
		if isNotFound(err) {
			return nil, err, nil
		}
		return nil, nil, err
	}
	switch h.State {
	case Sold:
		return nil, fmt.Errorf("hold_id %q is sold (payment %s): %w", h.ID, h.PaymentID, ErrConflict), nil
	case Released, Expired:
		return h, nil, nil
	}
	if err := closeHold(ctx, tx, b, h, Released, ""); err != nil {
		return nil, nil, err
	}
	h.State = Released
	return h, nil, nil
}

type expireOp struct {
	limit  int
	region string
}

// apply expires up to limit holds whose deadline has passed at the batch's decision time,
// oldest first, found through the (state, expires_at) index. Each goes through closeHold,
// so a hold confirmed earlier in the same batch is no longer selected and units come back
// once (I5).
func (o *expireOp) apply(ctx context.Context, tx pgx.Tx, b *batch) (any, error, error) {
	rows, err := tx.Query(ctx, `SELECT `+holdColumns+` FROM holds WHERE state = 'held' AND expires_at <= $1
		ORDER BY expires_at LIMIT $2`, b.now, o.limit)
	if err != nil {
		return nil, nil, fmt.Errorf("find expired holds: %w", err)
	}
	var due []Hold
	for rows.Next() {
		h, err := scanHold(rows, o.region)
		if err != nil {
			rows.Close()
			return nil, nil, err
		}
		due = append(due, h)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	for _, h := range due {
		if err := closeHold(ctx, tx, b, h, Expired, ""); err != nil {
			return nil, nil, err
		}
	}
	return len(due), nil, nil
}
