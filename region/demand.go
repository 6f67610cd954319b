package region

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5/pgxpool"
	"sync"
	"time"

	"github.com/quotaworks/quota/transfer"
)

// Demand's bookkeeping: how often the leader adds its counts to the demand table, and how long
// the table keeps them.
const (
	demandFlush     = time.Second
	demandRetention = time.Hour
)

// demandBook counts, per pool, the units buyers asked for at this leader and were refused for
// want of stock since its last flush (granted units are in the holds table already). It holds
// only pools of known sales and SKUs (such a refusal comes after the terms passed), so it is
// bounded by the region's pools.
type demandBook struct {
	mu    sync.Mutex
	units map[poolKey]transfer.Units
}

// count adds the units of one Reserve refused with err for want of stock (REGION_EXHAUSTED,
// SOLD_OUT); any other outcome adds nothing.
func (d *demandBook) count(req ReserveRequest, err error) {
	if !errors.Is(err, ErrRegionExhausted) && !errors.Is(err, ErrSoldOut) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.units == nil {
		d.units = map[poolKey]transfer.Units{}
	}
	d.units[poolKey{req.Sale, req.SKU}] += req.Quantity
}

// take empties the book and returns what it held.
func (d *demandBook) take() map[poolKey]transfer.Units {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.units
	d.units = nil
	return out
}

// flushEvery adds the book's counts to the demand table every demandFlush while ctx lasts,
// and deletes rows past demandRetention once a minute. The counts are advisory (the
// rebalancer's input): a failed write is logged and its counts dropped.
func (d *demandBook) flushEvery(ctx context.Context, cfg *Config, pool *pgxpool.Pool) {
	t := time.NewTicker(demandFlush)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := cfg.Clock.Now()
		if err := writeDemand(ctx, pool, now.Truncate(time.Second), d.take()); err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("recording demand failed; those counts are dropped", "region", cfg.Name, "err", err)
		}
		if i%60 == 0 {
			if _, err := pool.Exec(ctx, `DELETE FROM demand WHERE at < $1`, now.Add(-demandRetention)); err != nil && ctx.Err() == nil {
				cfg.Logger.Warn("deleting old demand failed", "region", cfg.Name, "err", err)
			}
		}
	}
}

// writeDemand adds counts to the demand table's rows of second at.
func writeDemand(ctx context.Context, pool *pgxpool.Pool, at time.Time, counts map[poolKey]transfer.Units) error {
	if len(counts) == 0 {
		return nil
	}
	var sales, skus []string
	var units []int64
	for k, n := range counts {
		sales, skus, units = append(sales, k.sale), append(skus, k.sku), append(units, int64(n))
	}
	_, err := pool.Exec(ctx, `INSERT INTO demand (sale_id, sku, at, units)
		SELECT s, k, $4, n FROM unnest($1::text[], $2::text[], $3::bigint[]) AS d(s, k, n)
		ON CONFLICT (sale_id, at, sku) DO UPDATE SET units = demand.units + EXCLUDED.units`, sales, skus, units, at)
	if err != nil {
		return fmt.Errorf("record demand: %w", err)
	}
	return nil
}
