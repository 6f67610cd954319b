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
