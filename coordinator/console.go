package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// Reads for the web console (coordinator/coordhttp): bounded lists of the ledger, so a page
// that refreshes every second costs a few indexed reads whatever the ledger holds.

// MaxListed bounds ListSales and RecentTransfers.
const MaxListed = 500

// SaleSummary is one line of the console's sales overview.
type SaleSummary struct {
	Sale        string
	CreatedAt   time.Time
	OpensAt     time.Time
	SKUs        int
	Total       transfer.Units
	Unallocated transfer.Units
	// Paused counts the sale's pauses in force (of the sale or of a SKU).
	Paused int
}

// ListSales lists the newest sales first, at most limit (1..MaxListed).
func (c *Coordinator) ListSales(ctx context.Context, limit int) ([]SaleSummary, error) {
	limit = min(max(limit, 1), MaxListed)
	rows, err := c.ledger.db.Query(ctx, `SELECT s.sale_id, s.created_at, s.opens_at,
			(SELECT count(*) FROM skus k WHERE k.sale_id = s.sale_id),
			(SELECT coalesce(sum(total), 0) FROM skus k WHERE k.sale_id = s.sale_id),
			(SELECT coalesce(sum(unallocated), 0) FROM skus k WHERE k.sale_id = s.sale_id),
			(SELECT count(*) FROM pauses p WHERE p.sale_id = s.sale_id AND p.paused)
		FROM sales s ORDER BY s.created_at DESC, s.sale_id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list sales: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SaleSummary, error) {
		var s SaleSummary
		var total, unalloc int64
		err := row.Scan(&s.Sale, &s.CreatedAt, &s.OpensAt, &s.SKUs, &total, &unalloc, &s.Paused)
		s.Total, s.Unallocated = transfer.Units(total), transfer.Units(unalloc)
		return s, err
	})
}

// RecentTransfers lists a sale's transfers for the console: stranded ones first, then the
// other unfinished ones, then the newest; at most limit (1..MaxListed).
func (c *Coordinator) RecentTransfers(ctx context.Context, sale string, limit int) ([]transfer.Transfer, error) {
	if err := checkSaleID(sale); err != nil {
		return nil, err
	}
	limit = min(max(limit, 1), MaxListed)
	rows, err := c.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE sale_id = $1
		ORDER BY stranded DESC, (state IN ('requested', 'pending')) DESC, created_at DESC, transfer_id LIMIT $2`, sale, limit)
	if err != nil {
		return nil, fmt.Errorf("list transfers: %w", err)
	}
	return pgx.CollectRows(rows, scanTransfer)
}
