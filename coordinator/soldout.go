package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/transfer"
)

// UnsoldReader reads, per SKU, a region's units of a sale that may still be sold (available
// and held) from its database (region.ReadUnsold).
type UnsoldReader func(ctx context.Context, sale string) (map[string]transfer.Stock, error)

// skuKey names one SKU of one sale.
type skuKey struct{ sale, sku string }

// flagKey is one flag of one SKU.
type flagKey struct {
	flag fencing.Flag
	skuKey
}

// stockFlags derives each SKU's sold-out and drained flags from the ledger and the
// regions' stock and publishes them (soldout.go), derives again a flag etcd holds that
// differs from what it published (flagwatch.go), and removes buyers' bindings to regions
// the cluster does not have (bindcheck.go).
type stockFlags struct {
	cfg       *Config
	ledger    *ledger
	regions   *regionSet
	unsoldLog readFailureLog
}

// soldOutLoop keeps the stock flags true to the stock while this coordinator leads. A SKU
// is sold out when every unit is sold: no region has one available or held (a hold may
// expire back into stock), the unallocated pool is empty and no transfer is unfinished; it
// is drained when no unit is available anywhere (some may be held). A round reads only the
// sales whose stock may have changed (feed): the ledger and each region database say when a
// sale's pool crosses zero or its ledger rows change, so idle sales cost nothing; while a
// source is not listening, every round reads every sale. The ledger and the regions are read
// at different instants, so a flag is raised only after two rounds in a row agree (the sale
// is read again next round); it is lowered at the first round that finds a unit. The flags
// only choose answers (SOLD_OUT rather than REGION_EXHAUSTED; a waiting room's "sold out"
// and its waitlist); nothing is granted or refused on them. A flag etcd holds that differs
// from what was published is derived again from the books (flagwatch.go).
func (sf *stockFlags) soldOutLoop(ctx context.Context, feed *changeFeed) {
	if sf.cfg.PublishFlag == nil {
		return
	}
	st := flagState{published: map[flagKey]bool{}, rounds: map[flagKey]int{}}
	seen := &seenFlags{flags: map[flagKey]bool{}}
	if sf.cfg.WatchFlags != nil {
		var wg sync.WaitGroup // the watch is this loop's: it ends with the term, and the loop waits for it
		defer wg.Wait()
		wg.Go(func() { sf.watchFlags(ctx, seen) })
	}
	every(ctx, sf.cfg.SoldOutInterval, func() {
		sf.checkSeen(seen, feed, st)
		sf.refreshSoldOut(ctx, feed, st)
	})
}

// flagState is the sold-out loop's memory: the flags it published, and how many rounds in a
// row found each one true.
type flagState struct {
	published map[flagKey]bool
	rounds    map[flagKey]int
}

// refreshSoldOut is one round of soldOutLoop: it reads the sales the feed names (or every
// sale) and publishes their flags; a sale it could not settle goes back to the feed.
func (sf *stockFlags) refreshSoldOut(ctx context.Context, feed *changeFeed, st flagState) {
	all, changed := feed.take()
	if !all && len(changed) == 0 {
		return
	}
	ledger, err := sf.ledgerRemaining(ctx, all, changed)
	if err != nil {
		feed.putBack(all, changed)
		if ctx.Err() == nil {
			sf.cfg.Logger.Warn("sold-out flags: reading the ledger failed; the next round tries again", "err", err)
		}
		return
	}
	unsold, available, read := sf.readUnsold(ctx, ledger)
	for k := range ledger {
		if !read[k.sale] {
			feed.again(k.sale) // unknown: publish nothing for this sale this round
			continue
		}
		settled := sf.publishFlag(ctx, flagKey{fencing.SoldOut, k}, unsold[k] == 0, st)
		settled = sf.publishFlag(ctx, flagKey{fencing.Drained, k}, available[k] == 0, st) && settled
		if !settled {
			feed.again(k.sale)
		}
	}
}

// readUnsold adds each region's units of ledger's sales to the ledger's: all that may still
// be sold (unsold) and all available. read names the sales every region answered for. Once a
// region fails a read (or takes over CallTimeout) no region is asked anything more this
// round, so one region down costs a round one timeout, not one per sale; the sales left are
// read again next round, and the failure is logged (at most once a minute a region).
func (sf *stockFlags) readUnsold(ctx context.Context, ledger map[skuKey]transfer.Units) (unsold, available map[skuKey]transfer.Units, read map[string]bool) {
	unsold, available, read = map[skuKey]transfer.Units{}, map[skuKey]transfer.Units{}, map[string]bool{}
	for k, u := range ledger {
		read[k.sale] = true
		unsold[k], available[k] = u, u
	}
	failed := map[string]error{}
	for sale := range read {
		if len(failed) > 0 { // a sale is read from every region or not at all
			delete(read, sale)
			continue
		}
		for _, r := range sf.cfg.Regions {
			if r.Unsold == nil {
				return unsold, available, map[string]bool{}
			}
			rctx, cancel := context.WithTimeout(ctx, sf.cfg.CallTimeout)
			stock, err := r.Unsold(rctx, sale)
			cancel()
			if err != nil {
				failed[r.Name] = fmt.Errorf("sale %s: %w", sale, err)
				delete(read, sale)
				break
			}
			for sku, s := range stock {
				unsold[skuKey{sale, sku}] += s.Available + s.Held
				available[skuKey{sale, sku}] += s.Available
			}
		}
	}
	if ctx.Err() == nil { // a term that ended is no news
		for region, err := range failed {
			sf.unsoldLog.warn(sf.cfg.Logger, sf.cfg.Clock.Now(), region, err)
		}
	}
	return unsold, available, read
}

// publishFlag raises a flag after two rounds in a row found it true, lowers it at once when a
// unit is found (never in the first round of a term, which would lower every sold-out flag
// for a round at each failover). It
// reports whether the flag is settled: published as the stock says, with no second round
// awaited and no failed publication to try again.
func (sf *stockFlags) publishFlag(ctx context.Context, k flagKey, none bool, st flagState) bool {
	if none {
		st.rounds[k]++
	} else {
		st.rounds[k] = 0
	}
	on := st.rounds[k] >= 2
	if none && !on {
		return false // a flag is lowered only when a unit is found, never while a round is awaited
	}
	settled := !none || on
	if prev, ok := st.published[k]; ok && prev == on {
		return settled
	}
	if err := sf.cfg.PublishFlag(ctx, k.flag, k.sale, k.sku, on); err != nil {
		sf.cfg.Logger.Warn("publishing a stock flag failed; the next round tries again", "flag", k.flag, "sale", k.sale, "sku", k.sku, "err", err)
		return false
	}
	st.published[k] = on
	return settled
}

// ledgerRemaining is, per SKU of every sale (all) or of sales, the unallocated units plus the
// units of unfinished transfers.
func (sf *stockFlags) ledgerRemaining(ctx context.Context, all bool, sales []string) (map[skuKey]transfer.Units, error) {
	q := `SELECT k.sale_id, k.sku, k.unallocated
			+ coalesce((SELECT sum(units) FROM transfers t WHERE t.sale_id = k.sale_id AND t.sku = k.sku
				AND t.state IN ('requested', 'pending')), 0)
		FROM skus k`
	var args []any
	if !all { // its own statement, so its plan looks the sales up by key
		q, args = q+` WHERE k.sale_id = ANY($1)`, []any{sales}
	}
	rows, err := sf.ledger.db.Query(ctx, q, args...)
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

// readFailureLog rate-limits the sold-out loop's warnings of failed region reads: at most one
// a region every readFailureLogEvery, with how many were not logged since, so a region down
// for an hour logs about 60 lines, not one each round.
type readFailureLog struct {
	mu    sync.Mutex
	last  map[string]time.Time
	quiet map[string]int
}

// readFailureLogEvery is how often a region's failed reads are logged at most.
const readFailureLogEvery = time.Minute

// warn logs region's failed read err at now, unless it logged one within readFailureLogEvery.
func (l *readFailureLog) warn(log *slog.Logger, now time.Time, region string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.quiet = map[string]time.Time{}, map[string]int{}
	}
	if last, ok := l.last[region]; ok && now.Sub(last) < readFailureLogEvery {
		l.quiet[region]++
		return
	}
	log.Warn("reading a region's stock for the sold-out flags failed; its sales are read again next round",
		"region", region, "err", err, "not_logged_since", l.quiet[region])
	l.last[region], l.quiet[region] = now, 0
}
