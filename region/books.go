package region

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// ReadBooks reads one consistent snapshot (one repeatable-read, read-only transaction) of a
// region's durable state for sale: pool counters, the sums over its holds, and its inbound
// transfer records. The auditor calls it on the region's database directly, so an audit
// needs no region process to be up.
func ReadBooks(ctx context.Context, db *pgxpool.Pool, region, sale string) (transfer.RegionBooks, error) {
	books := transfer.RegionBooks{Region: region, Inbound: map[string]transfer.InboundRecord{}, Outbound: map[string]transfer.OutboundRecord{}}
	err := pgutil.ReadTx(ctx, db, func(tx pgx.Tx) error {
		books.Pools, books.Inbound, books.Outbound = nil, map[string]transfer.InboundRecord{}, map[string]transfer.OutboundRecord{}
		rows, err := tx.Query(ctx, `SELECT p.sku, p.available, p.held, p.sold, p.credited_in, p.debited_out,
				coalesce((SELECT sum(quantity) FROM holds h WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND h.state = 'held'), 0),
				coalesce((SELECT sum(quantity) FROM holds h WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND h.state = 'sold'), 0)
			FROM pools p WHERE p.sale_id = $1 ORDER BY p.sku`, sale)
		if err != nil {
			return err
		}
		books.Pools, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.PoolBooks, error) {
			var a, h, s, ci, do, hh, sh int64
			p := transfer.PoolBooks{Sale: sale}
			err := row.Scan(&p.SKU, &a, &h, &s, &ci, &do, &hh, &sh)
			p.Available, p.Held, p.Sold, p.CreditedIn, p.DebitedOut = transfer.Units(a), transfer.Units(h), transfer.Units(s), transfer.Units(ci), transfer.Units(do)
			p.HeldInHolds, p.SoldInHolds = transfer.Units(hh), transfer.Units(sh)
			return p, err
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT transfer_id, sku, units, state FROM transfers_in WHERE sale_id = $1`, sale)
		if err != nil {
			return err
		}
		recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.InboundRecord, error) {
			rec := transfer.InboundRecord{Sale: sale}
			var u int64
			var st string
			err := row.Scan(&rec.ID, &rec.SKU, &u, &st)
			rec.Units, rec.State = transfer.Units(u), transfer.InState(st)
			return rec, err
		})
		for _, rec := range recs {
			books.Inbound[rec.ID] = rec
		}
		if err != nil {
			return err
		}
		books.Outbound, err = readOutbound(ctx, tx, sale)
		return err
	})
	if err != nil {
		return books, fmt.Errorf("read books of region %s: %w", region, err)
	}
	return books, nil
}

// readOutbound reads the source's records of the sale's outbound transfers.
func readOutbound(ctx context.Context, tx pgx.Tx, sale string) (map[string]transfer.OutboundRecord, error) {
	rows, err := tx.Query(ctx, `SELECT transfer_id, sku, to_pool, units, state FROM transfers_out WHERE sale_id = $1`, sale)
	if err != nil {
		return nil, err
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.OutboundRecord, error) {
		rec := transfer.OutboundRecord{Sale: sale}
		var u int64
		var st string
		err := row.Scan(&rec.ID, &rec.SKU, &rec.To, &u, &st)
		rec.Units, rec.State = transfer.Units(u), transfer.OutState(st)
		return rec, err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]transfer.OutboundRecord, len(recs))
	for _, rec := range recs {
		out[rec.ID] = rec
	}
	return out, nil
}

// RecentDemand reads, per SKU, the units buyers asked for at this region in the pools of sale
// since since: the units of holds created since then (whatever their state now), and the units
// refused for want of stock (the leader's counts, added to the demand table every second:
// demand.go), so a pool that ran dry still shows the buyers it turns away. Straight from the
// region's database, as the coordinator's rebalancing reads it.
func RecentDemand(ctx context.Context, db *pgxpool.Pool, sale string, since time.Time) (map[string]transfer.Units, error) {
	rows, err := db.Query(ctx, `SELECT sku, sum(q) FROM (
			SELECT sku, quantity AS q FROM holds WHERE sale_id = $1 AND created_at >= $2
			UNION ALL SELECT sku, units FROM demand WHERE sale_id = $1 AND at >= $2) d GROUP BY sku`, sale, since)
	if err != nil {
		return nil, fmt.Errorf("read recent demand: %w", err)
	}
	defer rows.Close()
	demand := map[string]transfer.Units{}
	for rows.Next() {
		var sku string
		var q int64
		if err := rows.Scan(&sku, &q); err != nil {
			return nil, fmt.Errorf("read recent demand: %w", err)
		}
		demand[sku] = transfer.Units(q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read recent demand: %w", err)
	}
	return demand, nil
}

// ReadUnsold reads, per SKU of a sale, the units at this region that may still be sold:
// available, plus held (a hold can expire back into stock). A cheap read, straight from the
// region's database, for the coordinator's sold-out flags.
func ReadUnsold(ctx context.Context, db *pgxpool.Pool, sale string) (map[string]transfer.Stock, error) {
	rows, err := db.Query(ctx, `SELECT sku, available, held FROM pools WHERE sale_id = $1`, sale)
	if err != nil {
		return nil, fmt.Errorf("read unsold: %w", err)
	}
	defer rows.Close()
	out := map[string]transfer.Stock{}
	for rows.Next() {
		var sku string
		var a, h int64
		if err := rows.Scan(&sku, &a, &h); err != nil {
			return nil, err
		}
		out[sku] = transfer.Stock{Available: transfer.Units(a), Held: transfer.Units(h)}
	}
	return out, rows.Err()
}

// StockChannel is the notification channel on which a region's database names a sale whose
// stock may have changed its sold-out or drained state (migration 11): a pool created,
// emptied or refilled, or refused demand recorded.
const StockChannel = "quota_stock"

// WatchStock calls changed with the sale of each notification on StockChannel, after ready
// once the subscription is in place (pgutil.Listen): whoever must miss no change reads every
// sale in ready. It returns when ctx ends or the connection fails; the caller listens again.
func WatchStock(ctx context.Context, db *pgxpool.Pool, ready func(), changed func(sale string)) error {
	return pgutil.Listen(ctx, db, StockChannel, ready, changed)
}
