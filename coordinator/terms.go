package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
)

// termsCourier delivers sale terms to the regions: at once when a sale is created
// (announce), and every RetryInterval those that did not arrive (loop), from the ledger's
// terms_undelivered queue.
type termsCourier struct {
	cfg     *Config
	ledger  *ledger
	regions *regionSet
}

// announceTimeout bounds announce's wait for each region.
const announceTimeout = time.Second

// announce tells every region the sale's terms, fenced by gen like any participant write
// (I4), so that a region given none of the stock answers REGION_EXHAUSTED (stock may be
// elsewhere) rather than NOT_FOUND. Briefly (announceTimeout), so a region that is down
// does not hold up the answer to CreateSale: a region not reached stays in
// terms_undelivered, and termsCourier.loop tries it again every RetryInterval.
func (tc *termsCourier) announce(ctx context.Context, gen int64, t SaleTerms) {
	var wg sync.WaitGroup
	for _, r := range tc.cfg.Regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc.deliverTo(ctx, gen, r, t)
		}()
	}
	wg.Wait()
}

// deliverTo gives one region a sale's terms and, once it has them, forgets that it had to.
// It tells whether to go on with the region's next sale: not after a failure that may pass
// (the region is likely down, or this coordinator deposed). Terms the region can never take
// (it holds the sale with other terms, or refuses them as invalid) are reported and dropped,
// so they do not hold up the region's other sales.
func (tc *termsCourier) deliverTo(ctx context.Context, gen int64, r RegionLink, t SaleTerms) bool {
	cctx, cancel := context.WithTimeout(ctx, min(tc.cfg.CallTimeout, announceTimeout))
	defer cancel()
	err := r.Participant.PutSale(cctx, gen, t)
	permanent := errors.Is(err, apierr.ErrAlreadyExists) || errors.Is(err, apierr.ErrInvalid)
	switch {
	case permanent:
		tc.cfg.Logger.Error("region refuses the sale's terms for good; they are no longer sent",
			"sale", t.Sale, "region", r.Name, "err", err)
	case err != nil:
		tc.cfg.Logger.Warn("sale terms not delivered yet; the coordinator tries again",
			"sale", t.Sale, "region", r.Name, "err", err)
		return false
	}
	if _, err := tc.ledger.db.Exec(ctx, `DELETE FROM terms_undelivered WHERE sale_id = $1 AND region = $2`, t.Sale, r.Name); err != nil {
		tc.cfg.Logger.Warn("record terms delivered", "sale", t.Sale, "region", r.Name, "err", err)
	}
	return true
}

// loop delivers, every RetryInterval while this coordinator leads, the sale terms that
// announce could not. It runs apart from transferDriver.loop, so a region that does not answer does
// not slow the transfers down.
func (tc *termsCourier) loop(ctx context.Context, gen int64) {
	every(ctx, tc.cfg.RetryInterval, func() { tc.deliverAll(ctx, gen) })
}

// deliverAll retries the terms that announce could not deliver: the regions at once, each
// region's sales in turn until one fails for a reason that may pass, so a round takes about
// announceTimeout at most. Rows naming a region this coordinator is not configured with wait
// for a coordinator that is.
func (tc *termsCourier) deliverAll(ctx context.Context, gen int64) {
	rows, err := tc.ledger.db.Query(ctx, `SELECT sale_id, region FROM terms_undelivered ORDER BY region, sale_id`)
	if err != nil {
		if ctx.Err() == nil {
			tc.cfg.Logger.Warn("list undelivered sale terms", "err", err)
		}
		return
	}
	type undelivered struct{ Sale, Region string }
	us, err := pgx.CollectRows(rows, pgx.RowToStructByPos[undelivered])
	if err != nil {
		return
	}
	sales := map[string][]string{}
	for _, u := range us {
		sales[u.Region] = append(sales[u.Region], u.Sale)
	}
	var wg sync.WaitGroup
	for name, ids := range sales {
		r, err := tc.regions.link(name)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, id := range ids {
				s, err := tc.ledger.sale(ctx, id)
				if err != nil || !tc.deliverTo(ctx, gen, r, s.Terms) {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// queueTermsForNewRegions queues every sale's terms for each configured region no leader was
// configured with before (regions_seen), then lists those regions: a region added to the
// configuration after sales were created learns their terms from termsCourier.loop, once. It runs in
// the takeover's fenced transaction, so only the current leader writes it (I4).
func queueTermsForNewRegions(ctx context.Context, tx pgx.Tx, regions []string) error {
	_, err := tx.Exec(ctx, `INSERT INTO terms_undelivered (sale_id, region)
		SELECT s.sale_id, r.region FROM sales s
		CROSS JOIN unnest($1::text[]) AS r(region)
		WHERE NOT EXISTS (SELECT 1 FROM regions_seen seen WHERE seen.region = r.region)
		ON CONFLICT DO NOTHING`, regions)
	if err != nil {
		return fmt.Errorf("queue sale terms for new regions: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO regions_seen (region) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`, regions); err != nil {
		return fmt.Errorf("record regions seen: %w", err)
	}
	return nil
}
