package coordinator

import (
	"context"

	"github.com/quotaworks/quota/transfer"
)

// UnsoldReader reads, per SKU, a region's units of a sale that may still be sold (available
// plus held) from its database (region.ReadUnsold).
type UnsoldReader func(ctx context.Context, sale string) (map[string]transfer.Units, error)

type skuKey struct{ sale, sku string }

// soldOutLoop keeps the sold-out flags true to the stock while this coordinator leads: a SKU
// is sold out when every unit is sold: no region has one available or held (a hold may
// expire back into stock), the unallocated pool is empty and no transfer is unfinished. The
// ledger and the regions are read at different instants, so a SKU is flagged only after two
// rounds in a row agree; a flag is lifted at the first round that finds a unit. The flags
// only choose between the SOLD_OUT and REGION_EXHAUSTED answers; nothing is granted or
// refused on them.
func (c *Coordinator) soldOutLoop(ctx context.Context) {
	defer c.wg.Done()
	if c.cfg.PublishSoldOut == nil {
		return
	}
	published, rounds := map[skuKey]bool{}, map[skuKey]int{}
	every(ctx, c.cfg.SoldOutInterval, func() { c.refreshSoldOut(ctx, published, rounds) })
}

func (c *Coordinator) refreshSoldOut(ctx context.Context, published map[skuKey]bool, rounds map[skuKey]int) {
	remaining, err := c.ledgerRemaining(ctx)
	if err != nil {
		return
	}
	sales := map[string]bool{}
	for k := range remaining {
		sales[k.sale] = true
	}
	for sale := range sales {
		for _, r := range c.cfg.Regions {
			if r.Unsold == nil {
				return
			}
			avail, err := r.Unsold(ctx, sale)
			if err != nil {
				delete(sales, sale) // unknown: publish nothing for this sale this round
				break
			}
			for sku, a := range avail {
				remaining[skuKey{sale, sku}] += a
			}
		}
	}
	for k, left := range remaining {
		if !sales[k.sale] {
			continue
		}
		if left == 0 {
			rounds[k]++
		} else {
			rounds[k] = 0
		}
		soldOut := rounds[k] >= 2
		if prev, ok := published[k]; ok && prev == soldOut {
			continue
		}
		if err := c.cfg.PublishSoldOut(ctx, k.sale, k.sku, soldOut); err == nil {
			published[k] = soldOut
		}
	}
}

// ledgerRemaining is, per SKU, the unallocated units plus the units of unfinished transfers.
func (c *Coordinator) ledgerRemaining(ctx context.Context) (map[skuKey]transfer.Units, error) {
	rows, err := c.db.Query(ctx, `SELECT k.sale_id, k.sku, k.unallocated
			+ coalesce((SELECT sum(units) FROM transfers t WHERE t.sale_id = k.sale_id AND t.sku = k.sku
				AND t.state IN ('requested', 'pending')), 0)
		FROM skus k`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[skuKey]transfer.Units{}
	for rows.Next() {
		var k skuKey
		var n int64
		if err := rows.Scan(&k.sale, &k.sku, &n); err != nil {
			return nil, err
		}
		out[k] = transfer.Units(n)
	}
	return out, rows.Err()
}
