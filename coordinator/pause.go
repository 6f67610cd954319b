package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// The kill switch. A pause of a sale (SKU "") or of one SKU is recorded in the ledger
// (pauses), with a row per region that does not have it yet (pauses_undelivered), in one
// fenced transaction; every region is then sent it (Participant.SetPaused), and records it
// in its own database before it answers. Regions not reached are tried again every
// RetryInterval by pauser.loop, on this leader or the next, until each has it.

// PauseVersion orders the changes of one pause: the ledger numbers them from the sequence
// pause_versions, rising, and a region records a change only over an older one.
type PauseVersion int64

// Pause is one sale's (SKU "") or SKU's pause as the ledger records it.
type Pause struct {
	Sale, SKU string
	// Paused is false for a resume; resumes are listed while some region has not got them.
	Paused    bool
	Reason    string
	ChangedAt time.Time
	Version   PauseVersion
	// Undelivered names the regions that do not have this change yet.
	Undelivered []string
}

// PauseChange asks to pause (Paused) or resume a sale (SKU "") or one of its SKUs. Resuming
// a sale resumes its SKUs too; resuming a SKU leaves a pause of the whole sale in force.
type PauseChange struct {
	Sale, SKU string
	Paused    bool
	Reason    string
}

// RegionFailure is a region a call could not reach, and why.
type RegionFailure struct{ Region, Error string }

// PauseResult is a pause or resume as carried out: the sale after it, the regions that have
// it durably, and those not reached (tried again every RetryInterval).
type PauseResult struct {
	Sale      Sale
	Reached   []string
	Unreached []RegionFailure
}

// pauseTimeout bounds one SetPaused call to a region.
const pauseTimeout = 2 * time.Second

// Check validates a pause or resume, naming the bad field.
func (p PauseChange) Check() error {
	if err := checkSaleID(p.Sale); err != nil {
		return err
	}
	if p.SKU != "" {
		if why := transfer.CheckID(p.SKU); why != "" {
			return apierr.Invalid("sku", "%s", why)
		}
	}
	if why := transfer.CheckText(p.Reason, transfer.MaxReasonLen); why != "" {
		return apierr.Invalid("reason", "%s", why)
	}
	return nil
}

// pauser records pause changes in the ledger and delivers them to the regions: at once
// (the facade's SetPaused) and every RetryInterval those some region does not have yet
// (loop), from the ledger's pauses_undelivered queue.
type pauser struct {
	cfg     *Config
	ledger  *ledger
	regions *regionSet
}

// SetPaused pauses or resumes new reservations of a sale or SKU in every region. It records
// the change in the ledger, then delivers it, and every change of the sale some region still
// lacks, to every region at once; it returns once each region has answered or failed
// (pauseTimeout), naming the regions that do not have it yet.
func (c *Coordinator) SetPaused(ctx context.Context, ch PauseChange) (PauseResult, error) {
	if err := ch.Check(); err != nil {
		return PauseResult{}, err
	}
	gen, err := c.Generation()
	if err != nil {
		return PauseResult{}, err
	}
	if err := c.ledger.fencedTx(ctx, gen, func(tx pgx.Tx) error { return c.pauses.record(ctx, tx, ch) }); err != nil {
		return PauseResult{}, err
	}
	failed, err := c.pauses.deliverAll(ctx, gen, ch.Sale)
	if err != nil {
		return PauseResult{}, err
	}
	var res PauseResult
	for _, r := range c.cfg.Regions {
		if err, ok := failed[r.Name]; ok {
			res.Unreached = append(res.Unreached, RegionFailure{Region: r.Name, Error: err.Error()})
		} else {
			res.Reached = append(res.Reached, r.Name)
		}
	}
	res.Sale, err = c.GetSale(ctx, ch.Sale)
	return res, err
}

// record writes a change to the ledger in the caller's fenced transaction (I4): the
// pause row, under a new version, and for each changed row one undelivered row per
// configured region. A resume changes only rows that are paused. It changes no count (I1,
// I2 untouched); only the regions' admission of new holds follows it.
func (pr *pauser) record(ctx context.Context, tx pgx.Tx, ch PauseChange) error {
	if err := saleMustExist(ctx, tx, ch.Sale); err != nil {
		return err
	}
	if ch.SKU != "" {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM skus WHERE sale_id = $1 AND sku = $2)`, ch.Sale, ch.SKU).Scan(&exists); err != nil {
			return fmt.Errorf("read sku: %w", err)
		}
		if !exists {
			return fmt.Errorf("sale %q has no sku %q: %w", ch.Sale, ch.SKU, ErrNotFound)
		}
	}
	now := pr.cfg.Clock.Now()
	var rows pgx.Rows
	var err error
	if ch.Paused {
		rows, err = tx.Query(ctx, `INSERT INTO pauses (sale_id, sku, paused, reason, version, changed_at)
			VALUES ($1, $2, true, $3, nextval('pause_versions'), $4)
			ON CONFLICT (sale_id, sku) DO UPDATE SET paused = true, reason = excluded.reason,
				version = excluded.version, changed_at = excluded.changed_at
			RETURNING sku, version`, ch.Sale, ch.SKU, ch.Reason, now)
	} else {
		// Without a SKU every pause of the sale is lifted; with one, that SKU's.
		rows, err = tx.Query(ctx, `UPDATE pauses SET paused = false, reason = $3, version = nextval('pause_versions'), changed_at = $4
			WHERE sale_id = $1 AND ($2 = '' OR sku = $2) AND paused
			RETURNING sku, version`, ch.Sale, ch.SKU, ch.Reason, now)
	}
	if err != nil {
		return fmt.Errorf("record pause: %w", err)
	}
	type changed struct {
		SKU     string
		Version int64
	}
	cs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[changed])
	if err != nil {
		return fmt.Errorf("record pause: %w", err)
	}
	for _, x := range cs {
		if _, err := tx.Exec(ctx, `INSERT INTO pauses_undelivered (sale_id, sku, region, version)
			SELECT $1, $2, unnest($3::text[]), $4
			ON CONFLICT (sale_id, sku, region) DO UPDATE SET version = excluded.version`,
			ch.Sale, x.SKU, pr.regions.names(), x.Version); err != nil {
			return fmt.Errorf("queue pause for the regions: %w", err)
		}
	}
	return nil
}

// queuePausesForNewRegions queues every pause in force for each configured region no leader
// was configured with before (regions_seen), in the takeover's fenced transaction (I4), so a
// region added later refuses new holds of what is paused too. It must run before
// queueTermsForNewRegions lists the regions.
func queuePausesForNewRegions(ctx context.Context, tx pgx.Tx, regions []string) error {
	_, err := tx.Exec(ctx, `INSERT INTO pauses_undelivered (sale_id, sku, region, version)
		SELECT p.sale_id, p.sku, r.region, p.version FROM pauses p
		CROSS JOIN unnest($1::text[]) AS r(region)
		WHERE p.paused AND NOT EXISTS (SELECT 1 FROM regions_seen seen WHERE seen.region = r.region)
		ON CONFLICT DO NOTHING`, regions)
	if err != nil {
		return fmt.Errorf("queue pauses for new regions: %w", err)
	}
	return nil
}

// loop delivers, every RetryInterval while this coordinator leads, the pause changes
// that some region does not have yet. It runs apart from the other loops, so a region that
// does not answer slows neither transfers nor terms.
func (pr *pauser) loop(ctx context.Context, gen int64) {
	every(ctx, pr.cfg.RetryInterval, func() {
		if _, err := pr.deliverAll(ctx, gen, ""); err != nil && ctx.Err() == nil {
			pr.cfg.Logger.Warn("list undelivered pauses", "err", err)
		}
	})
}

// deliverAll sends every region the pause changes (of one sale, or "" all) it does not
// have yet: the regions at once, each region's changes in turn until one fails for a reason
// that may pass. It returns the regions that failed, with the error.
func (pr *pauser) deliverAll(ctx context.Context, gen int64, sale string) (map[string]error, error) {
	pending, err := pr.undelivered(ctx, sale)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	failed := map[string]error{}
	var wg sync.WaitGroup
	for name, ps := range pending {
		r, err := pr.regions.link(name)
		if err != nil {
			continue // a region this coordinator is not configured with waits for one that is
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range ps {
				if err := pr.deliverTo(ctx, gen, r, p); err != nil {
					mu.Lock()
					failed[name] = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return failed, nil
}

// undelivered lists, per region, the current state of each pause (of one sale, or ""
// all) whose latest change the region does not have, oldest change first.
func (pr *pauser) undelivered(ctx context.Context, sale string) (map[string][]Pause, error) {
	rows, err := pr.ledger.db.Query(ctx, `SELECT u.region, p.sale_id, p.sku, p.paused, p.reason, p.version
		FROM pauses_undelivered u JOIN pauses p USING (sale_id, sku)
		WHERE $1 = '' OR u.sale_id = $1 ORDER BY u.region, p.version`, sale)
	if err != nil {
		return nil, fmt.Errorf("list undelivered pauses: %w", err)
	}
	out := map[string][]Pause{}
	var region string
	var p Pause
	var version int64
	_, err = pgx.ForEachRow(rows, []any{&region, &p.Sale, &p.SKU, &p.Paused, &p.Reason, &version}, func() error {
		p.Version = PauseVersion(version)
		out[region] = append(out[region], p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list undelivered pauses: %w", err)
	}
	return out, nil
}

// deliverTo gives one region a pause's latest change and, once it has recorded it (or a
// later one), forgets that it had to. A change the region refuses as invalid can never be
// delivered: it is reported and dropped. Any other failure is returned, for a later round.
func (pr *pauser) deliverTo(ctx context.Context, gen int64, r RegionLink, p Pause) error {
	cctx, cancel := context.WithTimeout(ctx, min(pr.cfg.CallTimeout, pauseTimeout))
	defer cancel()
	_, version, err := r.Participant.SetPaused(cctx, gen, p)
	if err == nil && version != p.Version {
		err = pr.checkForeign(ctx, r, p, version)
	}
	switch {
	case errors.Is(err, apierr.ErrInvalid):
		pr.cfg.Logger.Error("region refuses a pause for good; it is no longer sent", "sale", p.Sale, "sku", p.SKU,
			"paused", p.Paused, "region", r.Name, "err", err)
	case err != nil:
		pr.cfg.Logger.Warn("pause not delivered yet; the coordinator tries again", "sale", p.Sale, "sku", p.SKU,
			"paused", p.Paused, "region", r.Name, "err", err)
		return fmt.Errorf("region %s: %w", r.Name, err)
	}
	if _, err := pr.ledger.db.Exec(ctx, `DELETE FROM pauses_undelivered WHERE sale_id = $1 AND sku = $2 AND region = $3 AND version <= $4`,
		p.Sale, p.SKU, r.Name, int64(p.Version)); err != nil {
		return fmt.Errorf("record pause delivered to %s: %w", r.Name, err)
	}
	return nil
}

// checkForeign is for a region that answers a pause change with a version other than
// the one sent: a later change of this ledger's has superseded it (fine), or the region holds
// a change no coordinator of this ledger made, which only a misused coordinator certificate
// can send. That is an error, logged and returned, so the change stays undelivered and the
// operator is told the region was not reached; it is retried until a newer coordinator
// generation replaces the foreign change.
func (pr *pauser) checkForeign(ctx context.Context, r RegionLink, p Pause, have PauseVersion) error {
	var latest int64
	err := pr.ledger.db.QueryRow(ctx, `SELECT version FROM pauses WHERE sale_id = $1 AND sku = $2`, p.Sale, p.SKU).Scan(&latest)
	if err != nil {
		return fmt.Errorf("read the ledger's pause of %s/%s: %w", p.Sale, p.SKU, err)
	}
	if int64(have) <= latest {
		return nil
	}
	pr.cfg.Logger.Error("a region holds a pause change this ledger never made; is a coordinator certificate misused?",
		"region", r.Name, "sale", p.Sale, "sku", p.SKU, "region_version", have, "ledger_version", latest)
	return fmt.Errorf("region %s holds a pause change of %s/%s at version %d, above the ledger's %d: not made by this coordinator",
		r.Name, p.Sale, p.SKU, have, latest)
}

// pauses reads the pauses (of one sale, or "" all) in force, and the resumes some region
// does not have yet, each with the regions it has not reached.
func (l *ledger) pauses(ctx context.Context, sale string) ([]Pause, error) {
	rows, err := l.db.Query(ctx, `SELECT p.sale_id, p.sku, p.paused, p.reason, p.changed_at, p.version,
			coalesce(array_agg(u.region ORDER BY u.region) FILTER (WHERE u.region IS NOT NULL), '{}')
		FROM pauses p LEFT JOIN pauses_undelivered u USING (sale_id, sku)
		WHERE $1 = '' OR p.sale_id = $1
		GROUP BY p.sale_id, p.sku
		HAVING p.paused OR count(u.region) > 0
		ORDER BY p.sale_id, p.sku`, sale)
	if err != nil {
		return nil, fmt.Errorf("read pauses: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pause, error) {
		var p Pause
		var version int64
		err := row.Scan(&p.Sale, &p.SKU, &p.Paused, &p.Reason, &p.ChangedAt, &version, &p.Undelivered)
		p.Version = PauseVersion(version)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pauses: %w", err)
	}
	return ps, nil
}
