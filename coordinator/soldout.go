package coordinator

import (
	"context"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/transfer"
)

// UnsoldReader reads, per SKU, a region's units of a sale that may still be sold (available
// and held) from its database (region.ReadUnsold).
type UnsoldReader func(ctx context.Context, sale string) (map[string]transfer.Stock, error)

type skuKey struct{ sale, sku string }

// flagKey is one flag of one SKU.
type flagKey struct {
	flag fencing.Flag
	skuKey
}

// soldOutLoop keeps the stock flags true to the stock while this coordinator leads. A SKU
// is sold out when every unit is sold: no region has one available or held (a hold may
// expire back into stock), the unallocated pool is empty and no transfer is unfinished; it
// is drained when no unit is available anywhere (some may be held). The ledger and the
// regions are read at different instants, so a flag is raised only after two rounds in a
// row agree; it is lowered at the first round that finds a unit. The flags only choose
// answers (SOLD_OUT rather than REGION_EXHAUSTED; a waiting room's "sold out" and its
// waitlist); nothing is granted or refused on them.
func (c *Coordinator) soldOutLoop(ctx context.Context) {
	defer c.wg.Done()
	if c.cfg.PublishFlag == nil {
		return
	}
	published, rounds := map[flagKey]bool{}, map[flagKey]int{}
	every(ctx, c.cfg.SoldOutInterval, func() { c.refreshSoldOut(ctx, published, rounds) })
}

func (c *Coordinator) refreshSoldOut(ctx context.Context, published map[flagKey]bool, rounds map[flagKey]int) {
	ledger, err := c.ledgerRemaining(ctx)
	if err != nil {
		return
	}
	unsold, available := map[skuKey]transfer.Units{}, map[skuKey]transfer.Units{}
	sales := map[string]bool{}
	for k, u := range ledger {
		sales[k.sale] = true
		unsold[k], available[k] = u, u
	}
	for sale := range sales {
		for _, r := range c.cfg.Regions {
			if r.Unsold == nil {
				return
			}
			stock, err := r.Unsold(ctx, sale)
			if err != nil {
				delete(sales, sale) // unknown: publish nothing for this sale this round
				break
			}
			for sku, s := range stock {
				unsold[skuKey{sale, sku}] += s.Available + s.Held
				available[skuKey{sale, sku}] += s.Available
			}
		}
	}
	for k := range ledger {
		if !sales[k.sale] {
			continue
		}
		c.publishFlag(ctx, flagKey{fencing.SoldOut, k}, unsold[k] == 0, published, rounds)
		c.publishFlag(ctx, flagKey{fencing.Drained, k}, available[k] == 0, published, rounds)
	}
}

// publishFlag raises a flag after two rounds in a row found it true, lowers it at once.
func (c *Coordinator) publishFlag(ctx context.Context, k flagKey, none bool, published map[flagKey]bool, rounds map[flagKey]int) {
	if none {
		rounds[k]++
	} else {
		rounds[k] = 0
	}
	on := rounds[k] >= 2
	if prev, ok := published[k]; ok && prev == on {
		return
	}
	if err := c.cfg.PublishFlag(ctx, k.flag, k.sale, k.sku, on); err == nil {
		published[k] = on
	} else {
		c.cfg.Logger.Warn("publishing a stock flag failed; the next round tries again", "flag", k.flag, "sale", k.sale, "sku", k.sku, "err", err)
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
