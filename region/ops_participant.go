package region

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

type putSaleOp struct {
	gen   int64
	terms SaleTerms
}

// apply records the sale's terms, fenced by the coordinator's generation (I4). Terms never
// change once recorded: a different definition under the same id is refused.
func (o *putSaleOp) apply(ctx context.Context, b *batch) (any, error, error) {
	t := o.terms
	tx, outcome, fatal := b.fencedOp(ctx, t.Sale, o.gen)
	if tx == nil {
		return nil, outcome, fatal
	}
	have, err := readTerms(ctx, tx, t.Sale)
	if err == nil {
		if !sameTerms(have, t) {
			return nil, fmt.Errorf("sale_id %q is already defined with other terms: %w", t.Sale, ErrAlreadyExists), nil
		}
		return nil, nil, nil
	}
	if !isNotFound(err) {
		return nil, nil, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sales (sale_id, skus, per_user_limit, hold_ttl_ms, opens_at) VALUES ($1, $2, $3, $4, $5)`,
		t.Sale, t.SKUs, int64(t.PerUserLimit), t.HoldTTL.Milliseconds(), t.OpensAt); err != nil {
		return nil, nil, fmt.Errorf("insert sale: %w", err)
	}
	b.sales[t.Sale] = t
	return nil, nil, nil
}

func sameTerms(a, b SaleTerms) bool {
	return a.Sale == b.Sale && slices.Equal(a.SKUs, b.SKUs) && a.PerUserLimit == b.PerUserLimit &&
		a.HoldTTL == b.HoldTTL && a.OpensAt.Equal(b.OpensAt)
}

func readTerms(ctx context.Context, q rowQuerier, sale string) (SaleTerms, error) {
	t := SaleTerms{Sale: sale}
	var limit, ttl int64
	err := q.QueryRow(ctx, `SELECT skus, per_user_limit, hold_ttl_ms, opens_at FROM sales WHERE sale_id = $1`, sale).
		Scan(&t.SKUs, &limit, &ttl, &t.OpensAt)
	if err == pgx.ErrNoRows {
		return t, fmt.Errorf("sale_id %q: %w", sale, ErrNotFound)
	}
	if err != nil {
		return t, fmt.Errorf("read sale: %w", err)
	}
	t.PerUserLimit, t.HoldTTL = transfer.Units(limit), time.Duration(ttl)*time.Millisecond
	return t, nil
}

type creditOp struct {
	req CreditRequest
}

// creditResult is the destination's durable record of the transfer after the op.
type creditResult struct{ state transfer.InState }

// apply is protocol step 4 at the destination: it adds a transfer's units to the pool once
// per transfer id, fenced by the coordinator's generation (I4). A retry of the same credit
// answers "credited" again without adding anything; a credit after a refusal answers
// "refused" (I5: never both). Preserves I3: credited_in and available rise together.
func (o *creditOp) apply(ctx context.Context, b *batch) (any, error, error) {
	r := o.req
	tx, outcome, fatal := b.fencedOp(ctx, r.Sale, r.Generation)
	if tx == nil {
		return nil, outcome, fatal
	}
	terms, err := readTerms(ctx, tx, r.Sale)
	if err != nil {
		if isNotFound(err) {
			return nil, err, nil
		}
		return nil, nil, err
	}
	if !terms.HasSKU(r.SKU) {
		return nil, fmt.Errorf("sku %q is not in sale %s: %w", r.SKU, r.Sale, ErrNotFound), nil
	}
	have, err := readIn(ctx, tx, r.TransferID)
	if err != nil {
		return nil, nil, err
	}
	st, add, err := transfer.DecideCredit(have, transfer.InboundRecord{Sale: r.Sale, SKU: r.SKU, Units: r.Units})
	if err != nil {
		return nil, transferErr(r.TransferID, err), nil
	}
	if !add {
		return creditResult{state: st}, nil, nil
	}
	var avail int64
	err = tx.QueryRow(ctx, `INSERT INTO pools (sale_id, sku, available, held, sold, credited_in, debited_out)
		VALUES ($1, $2, $3, 0, 0, $3, 0)
		ON CONFLICT (sale_id, sku) DO UPDATE SET available = pools.available + excluded.available,
			credited_in = pools.credited_in + excluded.credited_in
		RETURNING available`, r.Sale, r.SKU, int64(r.Units)).Scan(&avail)
	if err != nil {
		return nil, nil, fmt.Errorf("credit pool: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO transfers_in (transfer_id, sale_id, sku, units, state, generation, recorded_at)
		VALUES ($1, $2, $3, $4, 'credited', $5, $6)`, r.TransferID, r.Sale, r.SKU, int64(r.Units), r.Generation, b.now); err != nil {
		return nil, nil, fmt.Errorf("record credit: %w", err)
	}
	b.setAvailable(poolKey{r.Sale, r.SKU}, transfer.Units(avail))
	return creditResult{state: transfer.InCredited}, nil, nil
}
