package region

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// requestHash fingerprints what a request key stands for, so a retry is told apart from a
// reuse of the key for a different request.
func requestHash(sku string, q transfer.Units) string {
	h := sha256.Sum256([]byte(sku + "\x00" + strconv.FormatInt(int64(q), 10)))
	return hex.EncodeToString(h[:16])
}

const holdColumns = `hold_id, sale_id, sku, user_id, quantity, request_key, state, created_at, expires_at, coalesce(payment_id, '')`

func scanHold(row pgx.Row, region string) (Hold, error) {
	h := Hold{Region: region}
	var q int64
	var st string
	err := row.Scan(&h.ID, &h.Sale, &h.SKU, &h.User, &q, &h.RequestKey, &st, &h.CreatedAt, &h.ExpiresAt, &h.PaymentID)
	h.Quantity, h.State = transfer.Units(q), HoldState(st)
	return h, err
}

type reserveOp struct {
	req    ReserveRequest
	terms  SaleTerms
	holdID string
	region string
}

// apply is the atomic conditional take: the pool's available ≥ q and the user's
// held + bought + q ≤ limit are decided on the values read in this transaction (the
// writer is the only one changing them; the epoch fence stops any other) and written with
// guards that fail the batch if that ever stops holding. Preserves I1 (available → held,
// the pool total unchanged), I2 (guards and CHECKs), I3 (credited_in and debited_out
// unchanged) and I6 (the hold is in the same commit as the counters).
func (o *reserveOp) apply(ctx context.Context, tx pgx.Tx, b *batch) (any, error, error) {
	req := o.req
	hash := requestHash(req.SKU, req.Quantity)
	prior, err := scanHoldWithHash(tx.QueryRow(ctx, `SELECT `+holdColumns+`, request_hash FROM holds
		WHERE sale_id = $1 AND user_id = $2 AND request_key = $3`, req.Sale, req.User, req.RequestKey), o.region)
	switch {
	case err == nil && prior.hash == hash:
		return ReserveResult{Hold: prior.Hold, Replayed: true}, nil, nil
	case err == nil:
		return nil, fmt.Errorf("request_key %q was used for a different request (sku %s, quantity %d): %w",
			req.RequestKey, prior.SKU, prior.Quantity, ErrAlreadyExists), nil
	case err != pgx.ErrNoRows:
		return nil, nil, fmt.Errorf("look up request key: %w", err)
	}
	var available, used int64
	err = tx.QueryRow(ctx, `SELECT p.available, coalesce(u.held_qty + u.bought_qty, 0)
		FROM pools p LEFT JOIN user_counts u ON u.sale_id = p.sale_id AND u.sku = p.sku AND u.user_id = $3
		WHERE p.sale_id = $1 AND p.sku = $2`, req.Sale, req.SKU, req.User).Scan(&available, &used)
	if err == pgx.ErrNoRows {
		return nil, fmt.Errorf("region %s has no stock of %s: %w", o.region, req.SKU, ErrRegionExhausted), nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read pool: %w", err)
	}
	if transfer.Units(available) < req.Quantity {
		b.touched[poolKey{req.Sale, req.SKU}] = transfer.Units(available)
		return nil, fmt.Errorf("region %s: %d of %s left, %d asked: %w", o.region, available, req.SKU, req.Quantity, ErrRegionExhausted), nil
	}
	if transfer.Units(used)+req.Quantity > o.terms.PerUserLimit {
		return nil, fmt.Errorf("user %s has %d of %s, limit %d: %w", req.User, used, req.SKU, o.terms.PerUserLimit, ErrLimitExceeded), nil
	}
	h := Hold{ID: o.holdID, Region: o.region, Sale: req.Sale, SKU: req.SKU, User: req.User, Quantity: req.Quantity,
		RequestKey: req.RequestKey, State: Held, CreatedAt: b.now, ExpiresAt: b.now.Add(o.terms.HoldTTL)}
	wb := &pgx.Batch{}
	wb.Queue(`UPDATE pools SET available = available - $3, held = held + $3
		WHERE sale_id = $1 AND sku = $2 AND available >= $3`, req.Sale, req.SKU, int64(req.Quantity))
	wb.Queue(`INSERT INTO user_counts (sale_id, sku, user_id, held_qty, bought_qty) VALUES ($1, $2, $3, $4, 0)
		ON CONFLICT (sale_id, sku, user_id) DO UPDATE SET held_qty = user_counts.held_qty + excluded.held_qty`,
		req.Sale, req.SKU, req.User, int64(req.Quantity))
	wb.Queue(`INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'held', $8, $9)`,
		h.ID, h.Sale, h.SKU, h.User, int64(h.Quantity), h.RequestKey, hash, h.CreatedAt, h.ExpiresAt)
	if err := execAll(ctx, tx, wb, 1, 1, 1); err != nil {
		return nil, nil, fmt.Errorf("reserve %s: %w", h.ID, err)
	}
	b.touched[poolKey{req.Sale, req.SKU}] = transfer.Units(available) - req.Quantity
	return ReserveResult{Hold: h}, nil, nil
}

type holdWithHash struct {
	Hold
	hash string
}

func scanHoldWithHash(row pgx.Row, region string) (holdWithHash, error) {
	var h holdWithHash
	var q int64
	var st string
	h.Region = region
	err := row.Scan(&h.ID, &h.Sale, &h.SKU, &h.User, &q, &h.RequestKey, &st, &h.CreatedAt, &h.ExpiresAt, &h.PaymentID, &h.hash)
	h.Quantity, h.State = transfer.Units(q), HoldState(st)
	return h, err
}

// execAll sends a batch of statements and checks each one changed exactly the number of
// rows expected. A guard that matches nothing means the writer's decision and the stored
// state disagree: the batch must not commit.
func execAll(ctx context.Context, tx pgx.Tx, b *pgx.Batch, want ...int64) error {
	res := tx.SendBatch(ctx, b)
	for i, w := range want {
		tag, err := res.Exec()
		if err != nil {
			res.Close()
			return fmt.Errorf("statement %d: %w", i, err)
		}
		if tag.RowsAffected() != w {
			res.Close()
			return fmt.Errorf("statement %d changed %d rows, want %d: guard failed", i, tag.RowsAffected(), w)
		}
	}
	return res.Close()
}
