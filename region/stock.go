package region

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

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

// SalePool is one pool's committed counts, with its sale.
type SalePool struct {
	Sale string
	PoolCounts
}

// AllPools reads every pool of every sale at this region as committed, ordered by sale and
// SKU: one query, as many rows as the coordinator's limits allow pools (the metrics read it
// on each scrape). A process that does not lead answers ErrNotLeader: only the leader's
// counts are the region's.
func (r *Region) AllPools(ctx context.Context) ([]SalePool, error) {
	if !r.Leading() {
		return nil, r.notLeader()
	}
	rows, err := r.pool.Query(ctx, `SELECT sale_id, sku, available, held, sold, credited_in, debited_out
		FROM pools ORDER BY sale_id, sku`)
	if err != nil {
		return nil, fmt.Errorf("read pools: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SalePool, error) {
		var p SalePool
		var a, h, s, ci, do int64
		err := row.Scan(&p.Sale, &p.SKU, &a, &h, &s, &ci, &do)
		p.Available, p.Held, p.Sold, p.CreditedIn, p.DebitedOut = transfer.Units(a), transfer.Units(h), transfer.Units(s), transfer.Units(ci), transfer.Units(do)
		return p, err
	})
}
