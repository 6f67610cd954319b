package region

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// verifyCommitted is the expensive check run after every committed batch when
// Config.Verify is set (QUOTA_VERIFY=1 in tests and CI): for each pool the batch touched it
// re-reads the stored counters and the sums over the pool's holds in one snapshot, and
// compares them with each other (I2, I3) and with the cache (available). The writer is the
// only writer, so any difference is this process's own bug: it crashes with the evidence.
func verifyCommitted(r *readCache, b *batch) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := pgutil.ReadTx(ctx, r.pool, func(tx pgx.Tx) error {
		for k := range b.touched {
			var p transfer.PoolBooks
			var a, h, s, ci, do, hh, sh int64
			err := tx.QueryRow(ctx, `SELECT available, held, sold, credited_in, debited_out,
				coalesce((SELECT sum(quantity) FROM holds WHERE sale_id = $1 AND sku = $2 AND state = 'held'), 0),
				coalesce((SELECT sum(quantity) FROM holds WHERE sale_id = $1 AND sku = $2 AND state = 'sold'), 0) +
				coalesce((SELECT sum(quantity) FROM holds_closed WHERE sale_id = $1 AND sku = $2 AND state = 'sold'), 0)
				FROM pools WHERE sale_id = $1 AND sku = $2`, k.sale, k.sku).Scan(&a, &h, &s, &ci, &do, &hh, &sh)
			if err == pgx.ErrNoRows {
				continue // a reserve against a pool this region never received
			}
			if err != nil {
				return err
			}
			p = transfer.PoolBooks{Sale: k.sale, SKU: k.sku, Available: transfer.Units(a), Held: transfer.Units(h), Sold: transfer.Units(s),
				CreditedIn: transfer.Units(ci), DebitedOut: transfer.Units(do), HeldInHolds: transfer.Units(hh), SoldInHolds: transfer.Units(sh)}
			if cached, ok := r.cachedAvailable(k); ok && cached != p.Available {
				panic(fmt.Sprintf("region %s: QUOTA_VERIFY: cached available %d != stored %d for %+v", r.cfg.Name, cached, p.Available, p))
			}
			if p.Available < 0 || p.Held < 0 || p.Sold < 0 || p.CreditedIn-p.DebitedOut != p.Available+p.Held+p.Sold ||
				p.Held != p.HeldInHolds || p.Sold != p.SoldInHolds {
				panic(fmt.Sprintf("region %s: QUOTA_VERIFY: I2/I3 broken after a batch: %+v", r.cfg.Name, p))
			}
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		r.cfg.Logger.Warn("QUOTA_VERIFY check could not read", "region", r.cfg.Name, "err", err)
	}
}
