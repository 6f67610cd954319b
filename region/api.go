package region

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

func checkIDs(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if r := transfer.CheckID(fields[i+1]); r != "" {
			return apierr.Invalid(fields[i], "%s", r)
		}
	}
	return nil
}

func checkQuantity(field string, q transfer.Units) error {
	if q <= 0 {
		return apierr.Invalid(field, "must be positive, got %d", q)
	}
	if q > transfer.MaxUnits {
		return apierr.Invalid(field, "%d is more than the maximum %d", q, transfer.MaxUnits)
	}
	return nil
}

// CheckReserve validates a reserve request's fields on their own (no state needed), naming
// the first bad field.
func CheckReserve(req ReserveRequest) error {
	if err := checkIDs("sale_id", req.Sale, "sku", req.SKU, "user_id", req.User, "request_key", req.RequestKey); err != nil {
		return err
	}
	return checkQuantity("quantity", req.Quantity)
}

// terms returns a sale's terms from the cache or the database.
func (r *Region) terms(ctx context.Context, sale string) (SaleTerms, error) {
	if t, ok := r.sales.Load(sale); ok {
		return t.(SaleTerms), nil
	}
	t, err := readTerms(ctx, r.pool, sale)
	if err != nil {
		return t, err
	}
	r.sales.Store(sale, t)
	return t, nil
}

// checkAgainstTerms refuses a reserve the sale's terms rule out before any state is read:
// an SKU not in the sale, a quantity over the per-user limit, a sale not open yet.
func checkAgainstTerms(t SaleTerms, req ReserveRequest, now time.Time) error {
	if !t.HasSKU(req.SKU) {
		return fmt.Errorf("sku %q is not in sale %s: %w", req.SKU, req.Sale, ErrNotFound)
	}
	if req.Quantity > t.PerUserLimit {
		return apierr.Invalid("quantity", "%d is over the per-user limit %d", req.Quantity, t.PerUserLimit)
	}
	if now.Before(t.OpensAt) {
		return fmt.Errorf("sale_id %q opens at %s (in %s): %w", req.Sale,
			t.OpensAt.UTC().Format(time.RFC3339), t.OpensAt.Sub(now).Round(time.Second), ErrNotOpen)
	}
	return nil
}

// Reserve takes req.Quantity units from this region's pool for req.User and returns the
// hold, durable before it returns (I6). Bad input changes nothing and names the field.
func (r *Region) Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error) {
	if err := CheckReserve(req); err != nil {
		return ReserveResult{}, err
	}
	t, err := r.terms(ctx, req.Sale)
	if err != nil {
		return ReserveResult{}, err
	}
	if err := checkAgainstTerms(t, req, r.cfg.Clock.Now()); err != nil {
		return ReserveResult{}, err
	}
	w, err := r.writer() // a standby answers NOT_LEADER, even for an empty pool
	if err != nil {
		return ReserveResult{}, err
	}
	k := keyKey{req.Sale, req.User, req.RequestKey}
	if avail, ok := r.cachedAvailable(poolKey{req.Sale, req.SKU}); ok && avail < req.Quantity && !r.inWriter(k) {
		return r.reserveWhenEmpty(ctx, req, k, avail)
	}
	o := &reserveOp{req: req, terms: t, holdID: r.newHoldID(), region: r.cfg.Name, exhausted: r.exhausted, maxKeys: r.cfg.MaxKeysPerUser}
	res, err := r.reserveInWriter(ctx, w, k, o)
	if errors.Is(err, errKeyRetired) {
		if prior, found, err := r.replayStored(ctx, req, k); found || err != nil {
			return prior, err
		}
		// SQL has no hold of this key: the digest was another key's. Between the two submits
		// the key is not counted as in the writer, so a same-key request meanwhile may be
		// answered by the empty-pool path as if it came first; no request is decided twice.
		o.keyLookedUp = true
		res, err = r.reserveInWriter(ctx, w, k, o)
	}
	return res, err
}

// reserveInWriter submits a reserve to the writer. The key counts as in the writer until its
// op is done, even if this caller gives up first: a retry meanwhile must go through the
// writer, not the empty-pool answer.
func (r *Region) reserveInWriter(ctx context.Context, w *writer, k keyKey, o *reserveOp) (ReserveResult, error) {
	r.track(k, 1)
	res, err := w.submitThen(ctx, o, func() { r.track(k, -1) })
	if err != nil {
		return ReserveResult{}, err
	}
	return res.(ReserveResult), nil
}

// replayStored answers a reserve whose key may be a retired hold's from that hold as stored:
// the same request gets the hold back (a replay), another one ALREADY_EXISTS. found is false
// when SQL has no hold of the key.
func (r *Region) replayStored(ctx context.Context, req ReserveRequest, k keyKey) (res ReserveResult, found bool, err error) {
	prior, found, err := storedKey(ctx, r.pool, r.cfg.Name, k)
	if !found || err != nil {
		return ReserveResult{}, found, err
	}
	res, err = replayOf(prior, req)
	return res, true, err
}

// replayOf answers a reserve whose key already has a hold: the hold itself when the request
// is the same (I6: a retry never takes units twice), ALREADY_EXISTS when it is another.
func replayOf(prior *memHold, req ReserveRequest) (ReserveResult, error) {
	if prior.hash != requestHash(req.SKU, req.Quantity) {
		return ReserveResult{}, fmt.Errorf("request_key %q was used for a different request (sku %s, quantity %d): %w",
			req.RequestKey, prior.SKU, prior.Quantity, ErrAlreadyExists)
	}
	return ReserveResult{Hold: prior.Hold, Replayed: true}, nil
}

// exhausted is the answer to a reserve this region's pool cannot satisfy: SOLD_OUT when the
// coordinator has flagged the SKU gone everywhere, REGION_EXHAUSTED (retry elsewhere or
// later) otherwise.
func (r *Region) exhausted(req ReserveRequest, avail transfer.Units) error {
	if r.cfg.SoldOut != nil && r.cfg.SoldOut(req.Sale, req.SKU) {
		return fmt.Errorf("sale %s: %s is sold out in every region: %w", req.Sale, req.SKU, ErrSoldOut)
	}
	return fmt.Errorf("region %s: %d of %s left, %d asked: %w", r.cfg.Name, avail, req.SKU, req.Quantity, ErrRegionExhausted)
}

// track counts the reserves of a key on their way through the writer.
func (r *Region) track(k keyKey, d int) {
	r.inWriterMu.Lock()
	defer r.inWriterMu.Unlock()
	if r.inWriterKeys[k] += d; r.inWriterKeys[k] == 0 {
		delete(r.inWriterKeys, k)
	}
}

func (r *Region) inWriter(k keyKey) bool {
	r.inWriterMu.Lock()
	defer r.inWriterMu.Unlock()
	return r.inWriterKeys[k] > 0
}

// reserveWhenEmpty answers a reserve the pool cannot satisfy without the writer and, but for
// a retired key, without SQL. The key is not in the writer (checked first), so the committed
// index has every hold it ever got (the writer publishes a hold before it answers), or its
// digest once the hold retired: a retry of a granted request gets its hold back, a new one is
// told the region is exhausted.
func (r *Region) reserveWhenEmpty(ctx context.Context, req ReserveRequest, k keyKey, avail transfer.Units) (ReserveResult, error) {
	m := r.state.Load()
	if m == nil {
		// The state was dropped (forget) after the count was read: nothing can be said
		// without it, and the writer is stopping.
		return ReserveResult{}, r.notLeader()
	}
	if prior, ok := m.committedKey(k); ok {
		return replayOf(prior, req)
	}
	if m.isRetired(k) { // a hold that closed long ago, or a digest collision: SQL tells
		if prior, found, err := r.replayStored(ctx, req, k); found || err != nil {
			return prior, err
		}
	}
	if err := r.paused.Load().refuse(req); err != nil {
		return ReserveResult{}, err
	}
	return ReserveResult{}, r.exhausted(req, avail)
}

func (r *Region) checkHoldID(id string) error {
	if err := checkIDs("hold_id", id); err != nil {
		return err
	}
	owner, _, found := strings.Cut(id, ".")
	if !found || owner == "" {
		return apierr.Invalid("hold_id", "%q is not a hold id: hold ids start with their region's name and a dot (%s.…)", id, r.cfg.Name)
	}
	if owner != r.cfg.Name {
		return fmt.Errorf("hold_id %q belongs to region %q, not %s: %w", id, owner, r.cfg.Name, ErrNotFound)
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

// Confirm records payment for a hold: held and unexpired → sold; otherwise the result says
// refund and the payment is recorded for reconciliation. Idempotent on (hold, payment).
func (r *Region) Confirm(ctx context.Context, holdID, paymentID string) (ConfirmResult, error) {
	if err := r.checkHoldID(holdID); err != nil {
		return ConfirmResult{}, err
	}
	if err := checkIDs("payment_id", paymentID); err != nil {
		return ConfirmResult{}, err
	}
	return submitForHold[ConfirmResult](ctx, r, holdID, func(stored *memHold) op {
		return &confirmOp{holdID: holdID, payment: paymentID, region: r.cfg.Name, stored: stored}
	})
}

// Release gives a held hold's units back; idempotent.
func (r *Region) Release(ctx context.Context, holdID string) (Hold, error) {
	if err := r.checkHoldID(holdID); err != nil {
		return Hold{}, err
	}
	return submitForHold[Hold](ctx, r, holdID, func(stored *memHold) op {
		return &releaseOp{holdID: holdID, region: r.cfg.Name, stored: stored}
	})
}

// submitForHold submits the op mk makes for a hold. When the writer does not have the hold in
// memory (it may be closed and retired), the hold is read from SQL (NOT_FOUND if it is not
// there either) and the op is submitted again with it, to be decided on the stored hold.
func submitForHold[T any](ctx context.Context, r *Region, holdID string, mk func(stored *memHold) op) (T, error) {
	res, err := submitAs[T](ctx, r, mk(nil))
	if !errors.Is(err, errHoldNotInMemory) {
		return res, err
	}
	h, err := readHold(ctx, r.pool, r.cfg.Name, holdID)
	if err != nil {
		return res, err
	}
	return submitAs[T](ctx, r, mk(&memHold{Hold: h}))
}

// GetReservation reads a hold as committed.
func (r *Region) GetReservation(ctx context.Context, holdID string) (Hold, error) {
	if err := r.checkHoldID(holdID); err != nil {
		return Hold{}, err
	}
	return readHold(ctx, r.pool, r.cfg.Name, holdID)
}

// Stock reads this region's pools of a sale as committed.
func (r *Region) Stock(ctx context.Context, sale string) ([]PoolCounts, error) {
	if err := checkIDs("sale_id", sale); err != nil {
		return nil, err
	}
	if _, err := r.terms(ctx, sale); err != nil {
		return nil, err
	}
	rows, err := r.pool.Query(ctx, `SELECT sku, available, held, sold, credited_in, debited_out
		FROM pools WHERE sale_id = $1 ORDER BY sku`, sale)
	if err != nil {
		return nil, fmt.Errorf("read pools: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (PoolCounts, error) {
		var p PoolCounts
		var a, h, s, ci, do int64
		err := row.Scan(&p.SKU, &a, &h, &s, &ci, &do)
		p.Available, p.Held, p.Sold, p.CreditedIn, p.DebitedOut = transfer.Units(a), transfer.Units(h), transfer.Units(s), transfer.Units(ci), transfer.Units(do)
		return p, err
	})
}

// PutSale records a sale's terms, fenced by the coordinator's generation.
func (r *Region) PutSale(ctx context.Context, gen int64, t SaleTerms) error {
	if err := CheckTerms(t); err != nil {
		return err
	}
	if err := r.checkGeneration(ctx, gen); err != nil {
		return err
	}
	// Keep the terms at the precision they are stored with (opens_at in microseconds, the
	// TTL in milliseconds), so a retry compares equal to the stored terms and the cached
	// terms are the ones a reload reads back.
	t.OpensAt, t.HoldTTL = t.OpensAt.Truncate(time.Microsecond), t.HoldTTL.Truncate(time.Millisecond)
	_, err := r.submit(ctx, &putSaleOp{gen: gen, terms: t})
	return err
}

// CheckCredit validates a Credit or a Refuse before it reaches the writer, naming the bad
// field: the ids, and units 0..MaxUnits (a credit of 0 creates the pool row, empty; the
// coordinator sends none, but nothing is wrong with one).
func CheckCredit(req CreditRequest) error {
	if err := checkIDs("transfer_id", req.TransferID, "sale_id", req.Sale, "sku", req.SKU); err != nil {
		return err
	}
	if req.Units < 0 || req.Units > transfer.MaxUnits {
		return apierr.Invalid("units", "must be 0..%d, got %d", transfer.MaxUnits, req.Units)
	}
	return nil
}

// CheckTerms validates a sale's terms, naming the bad field.
func CheckTerms(t SaleTerms) error {
	if err := checkIDs("sale_id", t.Sale); err != nil {
		return err
	}
	if len(t.SKUs) == 0 {
		return apierr.Invalid("skus", "a sale needs at least one SKU")
	}
	for _, s := range t.SKUs {
		if err := checkIDs("sku", s); err != nil {
			return err
		}
	}
	if t.PerUserLimit <= 0 || t.PerUserLimit > transfer.MaxUnits {
		return apierr.Invalid("per_user_limit", "must be 1..%d, got %d", transfer.MaxUnits, t.PerUserLimit)
	}
	if t.HoldTTL < time.Second || t.HoldTTL > 24*time.Hour {
		return apierr.Invalid("hold_ttl", "must be 1s..24h, got %s", t.HoldTTL)
	}
	return nil
}

// Credit adds a transfer's units to this region, once per transfer id, and returns the
// region's durable record of it (credited, or refused when a refusal came first).
func (r *Region) Credit(ctx context.Context, req CreditRequest) (transfer.InState, error) {
	if err := CheckCredit(req); err != nil {
		return "", err
	}
	if err := r.checkGeneration(ctx, req.Generation); err != nil {
		return "", err
	}
	res, err := submitAs[creditResult](ctx, r, &creditOp{req: req})
	return res.state, err
}
