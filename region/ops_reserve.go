package region

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// requestHash fingerprints what a request key stands for, so a retry is told apart from a
// reuse of the key for a different request: the first 16 bytes of a SHA-256, stored as hex.
func requestHash(sku string, q transfer.Units) [16]byte {
	var buf [64]byte
	h := sha256.Sum256(strconv.AppendInt(append(append(buf[:0], sku...), 0), int64(q), 10))
	return [16]byte(h[:16])
}

// rowQuerier is what a one-row read needs: a pool, a connection or a transaction.
type rowQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

const holdColumns = `hold_id, sale_id, sku, user_id, quantity, request_key, state, created_at, expires_at, coalesce(payment_id, '')`

// scanHold reads holdColumns, then any further columns into extra.
func scanHold(row pgx.Row, region string, extra ...any) (Hold, error) {
	h := Hold{Region: region}
	var q int64
	var st string
	dest := append([]any{&h.ID, &h.Sale, &h.SKU, &h.User, &q, &h.RequestKey, &st, &h.CreatedAt, &h.ExpiresAt, &h.PaymentID}, extra...)
	err := row.Scan(dest...)
	h.Quantity, h.State = transfer.Units(q), HoldState(st)
	return h, err
}

type reserveOp struct {
	req       ReserveRequest
	terms     SaleTerms
	holdID    string
	region    string
	exhausted func(ReserveRequest, transfer.Units) error
	maxKeys   int32 // Config.MaxKeysPerUser
	// keyLookedUp says SQL has no hold of the request's key: a retired digest that matches it
	// is another key's (a collision), not this one's.
	keyLookedUp bool
}

// apply is the atomic conditional take, decided in memory by the single writer: the pool's
// available ≥ q and the user's held + bought + q ≤ limit are checked and changed in the same
// step, and the hold and counters are written in this batch's commit, before any reply (I6).
// Preserves I1 (available → held), I2 (checked here, CHECKs in SQL) and I3 (credited_in and
// debited_out unchanged).
func (o *reserveOp) apply(_ context.Context, b *batch) (any, error, error) {
	req := o.req
	hash := requestHash(req.SKU, req.Quantity)
	k := keyKey{req.Sale, req.User, req.RequestKey}
	if prior, ok := b.key(k); ok {
		res, err := replayOf(prior, req)
		return res, err, nil
	}
	if !o.keyLookedUp && b.m.retiredKey(k) {
		return nil, errKeyRetired, nil // the caller looks the key up in SQL and asks again
	}
	if err := b.m.paused.refuse(req); err != nil {
		return nil, err, nil // the kill switch: no new hold (a retry of a granted one is answered above)
	}
	pk := poolKey{req.Sale, req.SKU}
	p := b.m.pools[pk]
	if p == nil {
		return nil, o.exhausted(req, 0), nil
	}
	if p.available < req.Quantity {
		b.touched[pk] = p.available
		return nil, o.exhausted(req, p.available), nil
	}
	var used transfer.Units
	if u := b.m.users[userKey{req.Sale, req.SKU, req.User}]; u != nil {
		used = u.held + u.bought
	}
	if used+req.Quantity > o.terms.PerUserLimit {
		return nil, fmt.Errorf("user %s has %d of %s, limit %d: %w", req.User, used, req.SKU, o.terms.PerUserLimit, ErrLimitExceeded), nil
	}
	if n := b.m.keysPer[saleUser{req.Sale, req.User}]; n >= o.maxKeys {
		return nil, fmt.Errorf("user %s has used %d request keys in sale %s here, the most a buyer may: %w", req.User, n, req.Sale, apierr.ErrTooManyKeys), nil
	}
	h := &memHold{Hold: Hold{ID: o.holdID, Region: o.region, Sale: req.Sale, SKU: req.SKU, User: req.User, Quantity: req.Quantity,
		RequestKey: req.RequestKey, State: Held, CreatedAt: b.now, ExpiresAt: b.now.Add(o.terms.HoldTTL)}, hash: hash}
	b.take(h)
	return ReserveResult{Hold: h.Hold}, nil, nil
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
		if w >= 0 && tag.RowsAffected() != w {
			res.Close()
			return fmt.Errorf("statement %d changed %d rows, want %d: guard failed", i, tag.RowsAffected(), w)
		}
	}
	return res.Close()
}
