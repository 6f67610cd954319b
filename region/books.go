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
// region's durable state for sale: pool counters, the sums over its holds, and its transfer
// records. The auditor calls it on the region's database directly, so an audit needs no
// region process to be up.
func ReadBooks(ctx context.Context, db *pgxpool.Pool, region, sale string) (transfer.RegionBooks, error) {
	books, err := ReadBooksOf(ctx, db, region, []string{sale})
	if err != nil {
		return transfer.RegionBooks{}, err
	}
	return books[sale], nil
}

// ReadBooksOf is ReadBooks of several sales (at most transfer.MaxBooksSales) in one snapshot and three
// statements, whatever their number, so an audit of every sale costs each region database one
// transaction rather than one per sale. Every sale asked for has its books in the answer
// (empty for a sale the region has no pool or record of).
func ReadBooksOf(ctx context.Context, db *pgxpool.Pool, region string, sales []string) (map[string]transfer.RegionBooks, error) {
	if len(sales) > transfer.MaxBooksSales {
		return nil, fmt.Errorf("read books of region %s: %d sales at once, at most %d", region, len(sales), transfer.MaxBooksSales)
	}
	var out map[string]transfer.RegionBooks
	err := pgutil.ReadTx(ctx, db, func(tx pgx.Tx) error {
		out = make(map[string]transfer.RegionBooks, len(sales))
		for _, s := range sales {
			out[s] = transfer.RegionBooks{Region: region, Inbound: map[string]transfer.InboundRecord{}, Outbound: map[string]transfer.OutboundRecord{}}
		}
		if err := readPoolBooks(ctx, tx, sales, out); err != nil {
			return err
		}
		if err := readInbound(ctx, tx, sales, out); err != nil {
			return err
		}
		return readOutbound(ctx, tx, sales, out)
	})
	if err != nil {
		return nil, fmt.Errorf("read books of region %s: %w", region, err)
	}
	return out, nil
}

// readPoolBooks reads the sales' pool counters and the sums over their holds into out, archived
// ones included (a sold hold's units stay sold when it moves to holds_closed).
func readPoolBooks(ctx context.Context, tx pgx.Tx, sales []string, out map[string]transfer.RegionBooks) error {
	rows, err := tx.Query(ctx, `SELECT p.sale_id, p.sku, p.available, p.held, p.sold, p.credited_in, p.debited_out,
			coalesce((SELECT sum(quantity) FROM holds h WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND h.state = 'held'), 0),
			coalesce((SELECT sum(quantity) FROM holds h WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND h.state = 'sold'), 0) +
			coalesce((SELECT sum(quantity) FROM holds_closed h WHERE h.sale_id = p.sale_id AND h.sku = p.sku AND h.state = 'sold'), 0)
		FROM pools p WHERE p.sale_id = ANY($1) ORDER BY p.sale_id, p.sku`, sales)
	if err != nil {
		return err
	}
	pools, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.PoolBooks, error) {
		var a, h, s, ci, do, hh, sh int64
		var p transfer.PoolBooks
		err := row.Scan(&p.Sale, &p.SKU, &a, &h, &s, &ci, &do, &hh, &sh)
		p.Available, p.Held, p.Sold, p.CreditedIn, p.DebitedOut = transfer.Units(a), transfer.Units(h), transfer.Units(s), transfer.Units(ci), transfer.Units(do)
		p.HeldInHolds, p.SoldInHolds = transfer.Units(hh), transfer.Units(sh)
		return p, err
	})
	for _, p := range pools {
		b := out[p.Sale]
		b.Pools = append(b.Pools, p)
		out[p.Sale] = b
	}
	return err
}

// readInbound reads the destination's records of the sales' inbound transfers into out.
func readInbound(ctx context.Context, tx pgx.Tx, sales []string, out map[string]transfer.RegionBooks) error {
	rows, err := tx.Query(ctx, `SELECT sale_id, transfer_id, sku, units, state FROM transfers_in WHERE sale_id = ANY($1)`, sales)
	if err != nil {
		return err
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.InboundRecord, error) {
		var rec transfer.InboundRecord
		var u int64
		var st string
		err := row.Scan(&rec.Sale, &rec.ID, &rec.SKU, &u, &st)
		rec.Units, rec.State = transfer.Units(u), transfer.InState(st)
		return rec, err
	})
	for _, rec := range recs {
		out[rec.Sale].Inbound[rec.ID] = rec
	}
	return err
}

// readOutbound reads the source's records of the sales' outbound transfers into out.
func readOutbound(ctx context.Context, tx pgx.Tx, sales []string, out map[string]transfer.RegionBooks) error {
	rows, err := tx.Query(ctx, `SELECT sale_id, transfer_id, sku, to_pool, units, state FROM transfers_out WHERE sale_id = ANY($1)`, sales)
	if err != nil {
		return err
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.OutboundRecord, error) {
		var rec transfer.OutboundRecord
		var u int64
		var st string
		err := row.Scan(&rec.Sale, &rec.ID, &rec.SKU, &rec.To, &u, &st)
		rec.Units, rec.State = transfer.Units(u), transfer.OutState(st)
		return rec, err
	})
	for _, rec := range recs {
		out[rec.Sale].Outbound[rec.ID] = rec
	}
	return err
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
// stock may have changed its sold-out or drained state (migration 12): a pool created,
// emptied or refilled, or refused demand recorded.
const StockChannel = "quota_stock"

// WatchStock calls changed with the sale of each notification on StockChannel, after ready
// once the subscription is in place (pgutil.Listen): whoever must miss no change reads every
// sale in ready. It returns when ctx ends or the connection fails; the caller listens again.
func WatchStock(ctx context.Context, db *pgxpool.Pool, ready func(), changed func(sale string)) error {
	return pgutil.Listen(ctx, db, StockChannel, ready, changed)
}

// ReadBuyerUnits calls fn with every buyer's units of every SKU of sale at this region (held
// and sold holds, and sold holds archived in holds_closed), in one read-only snapshot,
// ordered by SKU and buyer. Rows are streamed: the caller bounds what it keeps. The auditor
// reads it from the region's database directly (quotactl audit --limits).
func ReadBuyerUnits(ctx context.Context, db *pgxpool.Pool, sale string, fn func(transfer.BuyerUnits) error) error {
	err := pgutil.ReadTx(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT sku, user_id, sum(quantity) FROM (
				SELECT sku, user_id, quantity FROM holds WHERE sale_id = $1 AND state IN ('held', 'sold')
				UNION ALL
				SELECT sku, user_id, quantity FROM holds_closed WHERE sale_id = $1 AND state = 'sold'
			) u GROUP BY sku, user_id ORDER BY sku, user_id`, sale)
		if err != nil {
			return err
		}
		var b transfer.BuyerUnits
		var units int64
		_, err = pgx.ForEachRow(rows, []any{&b.SKU, &b.User, &units}, func() error {
			b.Units = transfer.Units(units)
			return fn(b)
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("read buyers' units of sale %s: %w", sale, err)
	}
	return nil
}

// ReadLatePayments lists up to limit late payments at this region (of sale, or of every sale
// when sale is empty), oldest first, each with its hold as holds or holds_closed keep it.
func ReadLatePayments(ctx context.Context, db *pgxpool.Pool, region, sale string, limit int) ([]transfer.LatePayment, error) {
	rows, err := db.Query(ctx, `SELECT l.hold_id, l.payment_id, l.hold_state, l.received_at,
			coalesce(h.sale_id, c.sale_id, ''), coalesce(h.sku, c.sku, ''), coalesce(h.user_id, c.user_id, ''),
			coalesce(h.quantity, c.quantity, 0), coalesce(h.expires_at, c.expires_at), coalesce(h.closed_at, c.closed_at)
		FROM late_payments l LEFT JOIN holds h ON h.hold_id = l.hold_id LEFT JOIN holds_closed c ON c.hold_id = l.hold_id
		WHERE $1 = '' OR coalesce(h.sale_id, c.sale_id) = $1
		ORDER BY l.received_at, l.hold_id, l.payment_id LIMIT $2`, sale, limit)
	if err != nil {
		return nil, fmt.Errorf("read late payments of region %s: %w", region, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.LatePayment, error) {
		l := transfer.LatePayment{Region: region}
		var qty int64
		var expires, closed *time.Time
		err := row.Scan(&l.HoldID, &l.PaymentID, &l.HoldState, &l.ReceivedAt, &l.Sale, &l.SKU, &l.User, &qty, &expires, &closed)
		l.Quantity = transfer.Units(qty)
		if expires != nil {
			l.ExpiresAt = *expires
		}
		if closed != nil {
			l.ClosedAt = *closed
		}
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("read late payments of region %s: %w", region, err)
	}
	return out, nil
}
