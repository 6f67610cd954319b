package bench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/region"
)

// TakeoverPoint is one point of the takeover curve: a region's database with ClosedHolds
// archived closed holds of an earlier sale (holds_closed, as the archiver leaves them) and
// the live holds of a running one, beside a baseline database with the same live holds and
// no history.
type TakeoverPoint struct {
	ClosedHolds int64 `json:"closed_holds"`
	// HoldRows is the rows of the holds table a cold takeover reads (the live sale's), and
	// ArchivedRows those of holds_closed, which it does not read.
	HoldRows     int64 `json:"hold_rows"`
	ArchivedRows int64 `json:"archived_rows"`
	// LiveHolds is the held holds stored when the warm standby took over.
	LiveHolds int64 `json:"live_holds"`
	// ColdMs is a cold takeover (Region.Lead of a process with no copy of the state: the
	// epoch raised, every hold in the holds table read): the median of ColdRuns.
	// BaselineMs is the same on the baseline database, each of its runs taken just before
	// one of ColdRuns, so both see the same machine; ColdVsBaseline is ColdMs over it.
	ColdMs         float64   `json:"cold_ms"`
	ColdRuns       []float64 `json:"cold_runs_ms"`
	BaselineMs     float64   `json:"baseline_cold_ms"`
	BaselineRuns   []float64 `json:"baseline_cold_runs_ms"`
	ColdVsBaseline float64   `json:"cold_vs_baseline"`
	// HeapMiB is the Go heap the cold leader's state holds (live heap after its load, less
	// before, each after a collection), in the last cold run; BaselineHeapMiB the same on
	// the baseline database.
	HeapMiB         float64 `json:"cold_leader_heap_mib"`
	BaselineHeapMiB float64 `json:"baseline_leader_heap_mib"`
	// WarmMs is the warm standby's takeover after the old leader made CaughtUp reservations
	// and stepped down; Warm says the standby did take over from its copy.
	WarmMs   float64 `json:"warm_ms"`
	CaughtUp int     `json:"warm_reservations_before"`
	Warm     bool    `json:"warm"`
}

// takeover curve's sales: the closed history and the running sale.
const (
	closedSale = "closed"
	liveSale   = "live"
)

// takeoverDB is one database of the takeover curve and the last epoch raised in it.
type takeoverDB struct {
	db    *pgxpool.Pool
	epoch int64
}

// openTakeoverDB creates, migrates and opens a database of the takeover curve with the two
// sales and live held holds of the running one.
func openTakeoverDB(ctx context.Context, cfg *ScaleConfig, dbs *databases, name string, live int64) (*takeoverDB, error) {
	url, err := dbs.create(ctx, name)
	if err != nil {
		return nil, err
	}
	db, err := pgutil.Open(ctx, url, 16)
	if err != nil {
		return nil, err
	}
	t := &takeoverDB{db: db}
	if err := region.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate the takeover database: %w", err)
	}
	if err := createTakeoverSales(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	cfg.progress("takeover: storing %d live holds in %s", live, name)
	if err := insertLiveHolds(ctx, db, live); err != nil {
		db.Close()
		return nil, err
	}
	return t, nil
}

// runTakeoverCurve stores cfg.TakeoverLive held holds of the running sale in two region
// databases of their own, then grows the archived closed holds of an earlier sale in one of
// them and, at each point, times cold takeovers of both, alternately, and a warm standby's.
func runTakeoverCurve(ctx context.Context, cfg *ScaleConfig, dbs *databases) ([]TakeoverPoint, error) {
	hist, err := openTakeoverDB(ctx, cfg, dbs, cfg.DBPrefix+"_to", cfg.TakeoverLive)
	if err != nil {
		return nil, err
	}
	defer hist.db.Close()
	base, err := openTakeoverDB(ctx, cfg, dbs, cfg.DBPrefix+"_tb", cfg.TakeoverLive)
	if err != nil {
		return nil, err
	}
	defer base.db.Close()
	var out []TakeoverPoint
	var stored int64
	for _, n := range cfg.ClosedHolds {
		cfg.progress("takeover: archiving %d closed holds", n)
		if err := insertArchivedHolds(ctx, hist.db, closedSale, "sku", "c", stored, n); err != nil {
			return out, err
		}
		stored = max(stored, n)
		for _, t := range []*takeoverDB{hist, base} {
			if _, err := t.db.Exec(ctx, `VACUUM ANALYZE holds, holds_closed, archived_users, archived_pools`); err != nil {
				return out, fmt.Errorf("vacuum holds: %w", err)
			}
		}
		p, err := takeoverPoint(ctx, cfg, hist, base, stored)
		if err != nil {
			return out, err
		}
		cfg.progress("takeover: %d archived holds: cold %.0f ms (%.2f× the %.0f ms without history), heap %.0f MiB (%.0f without), warm %.0f ms (warm: %v)",
			n, p.ColdMs, p.ColdVsBaseline, p.BaselineMs, p.HeapMiB, p.BaselineHeapMiB, p.WarmMs, p.Warm)
		out = append(out, p)
	}
	return out, nil
}

// createTakeoverSales stores the terms and the pools of the closed and the live sale.
func createTakeoverSales(ctx context.Context, db *pgxpool.Pool) error {
	if _, err := db.Exec(ctx, `INSERT INTO sales (sale_id, skus, per_user_limit, hold_ttl_ms, opens_at)
			VALUES ($1, '{sku}', 1, 3600000, now() - interval '1 day'), ($2, '{sku}', 1, 3600000, now() - interval '1 day')`,
		closedSale, liveSale); err != nil {
		return fmt.Errorf("create the takeover sales: %w", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO pools (sale_id, sku, available, held, sold, credited_in, debited_out)
			VALUES ($1, 'sku', 0, 0, 0, 0, 0), ($2, 'sku', 100000000, 0, 0, 100000000, 0)`, closedSale, liveSale); err != nil {
		return fmt.Errorf("create the takeover pools: %w", err)
	}
	return nil
}

// insertLiveHolds stores n held holds of the live sale, one unit each for n buyers, expiring
// in a day, moving their units from available to held, in batches of 100,000 rows.
func insertLiveHolds(ctx context.Context, db *pgxpool.Pool, n int64) error {
	const chunk = 100_000
	for a := int64(0); a < n; a += chunk {
		b := min(n, a+chunk)
		_, err := db.Exec(ctx, `WITH ins AS (INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash,
				state, created_at, expires_at, changed)
			SELECT 'l.' || g, $1, 'sku', 'l-u' || g, 1, 'k', md5('l' || g::text), 'held', now(), now() + interval '1 day', 0
			FROM generate_series($2::bigint, $3::bigint - 1) g RETURNING 1),
			n AS (SELECT count(*) AS c FROM ins)
			UPDATE pools SET available = available - n.c, held = held + n.c FROM n WHERE sale_id = $1 AND sku = 'sku'`, liveSale, a, b)
		if err != nil {
			return fmt.Errorf("store live holds %d..%d: %w", a, b, err)
		}
	}
	return nil
}

// insertArchivedHolds stores holds lo..hi-1 of (sale, sku) as the archiver leaves them: sold
// a day ago, in holds_closed, with their buyers' (ten holds each) and their pool's archived
// counts, credited to the pool and sold in the same transaction, in batches of 100,000 rows.
func insertArchivedHolds(ctx context.Context, db *pgxpool.Pool, sale, sku, tag string, lo, hi int64) error {
	const chunk = 100_000
	for a := lo; a < hi; a += chunk {
		b := min(hi, a+chunk)
		res, err := db.Exec(ctx, `WITH ins AS (INSERT INTO holds_closed (hold_id, sale_id, sku, user_id, quantity, request_key,
				request_hash, state, created_at, expires_at, closed_at, payment_id, changed, archived)
			SELECT $3 || '.' || g, $1, $2, $3 || '-u' || (g / 10), 1, 'k' || g, md5($3 || g::text), 'sold', now() - interval '2 days',
				now() - interval '1 day', now() - interval '1 day', 'pay-' || g, 0, 0
			FROM generate_series($4::bigint, $5::bigint - 1) g RETURNING user_id),
			byuser AS (INSERT INTO archived_users AS u (sale_id, user_id, sku, holds, sold)
				SELECT $1, user_id, $2, count(*), count(*) FROM ins GROUP BY user_id
				ON CONFLICT (sale_id, user_id, sku) DO UPDATE SET holds = u.holds + excluded.holds, sold = u.sold + excluded.sold),
			bypool AS (INSERT INTO archived_pools AS p (sale_id, sku, holds, sold) SELECT $1, $2, count(*), count(*) FROM ins
				HAVING count(*) > 0
				ON CONFLICT (sale_id, sku) DO UPDATE SET holds = p.holds + excluded.holds, sold = p.sold + excluded.sold),
			n AS (SELECT count(*) AS c FROM ins)
			UPDATE pools SET credited_in = credited_in + n.c, sold = sold + n.c FROM n WHERE sale_id = $1 AND sku = $2`,
			sale, sku, tag, a, b)
		if err != nil {
			return fmt.Errorf("archive holds %d..%d: %w", a, b, err)
		}
		if res.RowsAffected() != 1 {
			return fmt.Errorf("archive holds %d..%d: no pool %s/%s", a, b, sale, sku)
		}
	}
	return nil
}

// takeoverPoint times cfg.TakeoverRuns cold takeovers of hist, each just after one of base,
// then a warm standby's of hist after the last cold leader made cfg.LiveOps reservations and
// stepped down.
func takeoverPoint(ctx context.Context, cfg *ScaleConfig, hist, base *takeoverDB, closed int64) (TakeoverPoint, error) {
	p := TakeoverPoint{ClosedHolds: closed, CaughtUp: cfg.LiveOps}
	if err := hist.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM holds), (SELECT count(*) FROM holds_closed)`).Scan(&p.HoldRows, &p.ArchivedRows); err != nil {
		return p, fmt.Errorf("count the stored holds: %w", err)
	}
	var a *region.Region
	defer func() {
		if a != nil {
			a.Close()
		}
	}()
	var cold time.Duration
	for i := range cfg.TakeoverRuns {
		if a != nil {
			a.Close() // steps down, and its state goes: each run's takeover is cold, alone in the process
		}
		b, d, heap, err := coldTakeover(ctx, cfg, base)
		if b != nil {
			b.Close()
		}
		if err != nil {
			return p, fmt.Errorf("cold takeover %d without history: %w", i+1, err)
		}
		p.BaselineRuns, p.BaselineHeapMiB = append(p.BaselineRuns, round1(ms(d))), heap
		a, cold, p.HeapMiB, err = coldTakeover(ctx, cfg, hist)
		if err != nil {
			return p, fmt.Errorf("cold takeover %d: %w", i+1, err)
		}
		p.ColdRuns = append(p.ColdRuns, round1(ms(cold)))
	}
	p.ColdMs, p.BaselineMs = median(p.ColdRuns), median(p.BaselineRuns)
	p.ColdVsBaseline = round2(p.ColdMs / p.BaselineMs)
	return p, warmTakeover(ctx, cfg, hist.db, a, &hist.epoch, cold, &p)
}

// coldTakeover has a new region process with no copy of the state lead t's database, and
// returns it (to be closed by the caller, also on error), how long Lead took and the Go heap
// its state holds, in MiB.
func coldTakeover(ctx context.Context, cfg *ScaleConfig, t *takeoverDB) (*region.Region, time.Duration, float64, error) {
	r, err := region.New(region.Config{Name: benchRegion, StandbyRefresh: -1, Logger: cfg.Logger}, t.db)
	if err != nil {
		return nil, 0, 0, err
	}
	heap0 := liveHeap()
	t.epoch++
	t0 := time.Now()
	if err := r.Lead(ctx, t.epoch); err != nil {
		return r, 0, 0, err
	}
	d := time.Since(t0)
	return r, d, round1(float64(liveHeap()-heap0) / (1 << 20)), nil
}

// median is the middle of xs (the upper one of an even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}

// warmTakeover starts a warm standby beside leader a, lets it load its copy, has a make
// cfg.LiveOps reservations and stop, and times the standby's takeover into p.
func warmTakeover(ctx context.Context, cfg *ScaleConfig, db *pgxpool.Pool, a *region.Region, epoch *int64, cold time.Duration, p *TakeoverPoint) error {
	b, err := region.New(region.Config{Name: benchRegion, StandbyRefresh: time.Second, Logger: cfg.Logger}, db)
	if err != nil {
		return err
	}
	defer b.Close()
	wctx, stopWarm := context.WithCancel(ctx)
	defer stopWarm()
	go b.KeepWarm(wctx)
	// The standby's first copy is a load as long as the cold one; give it twice that.
	if err := sleepCtx(ctx, 2*cold+time.Second); err != nil {
		return err
	}
	if err := reserveLive(ctx, a, *epoch, cfg.LiveOps); err != nil {
		return err
	}
	a.Close()
	if err := db.QueryRow(ctx, `SELECT count(*) FROM holds WHERE state = 'held'`).Scan(&p.LiveHolds); err != nil {
		return fmt.Errorf("count the live holds: %w", err)
	}
	*epoch++
	t1 := time.Now()
	if err := b.Lead(ctx, *epoch); err != nil {
		return fmt.Errorf("warm takeover: %w", err)
	}
	p.WarmMs = round1(ms(time.Since(t1)))
	_, warm := b.Takeovers()
	p.Warm = warm == 1
	return nil
}

// reserveLive makes n reservations of the live sale at leader r, 64 at a time.
func reserveLive(ctx context.Context, r *region.Region, epoch int64, n int) error {
	return inParallel(ctx, n, 64, func(ctx context.Context, i int) error {
		_, err := r.Reserve(ctx, region.ReserveRequest{Sale: liveSale, SKU: "sku", User: "e" + strconv.FormatInt(epoch, 10) + "-" + strconv.Itoa(i),
			Quantity: 1, RequestKey: "k"})
		if err != nil {
			return fmt.Errorf("reserve at the leader: %w", err)
		}
		return nil
	})
}

// liveHeap is the Go heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// round2 keeps two decimals.
func round2(x float64) float64 { return math.Round(x*100) / 100 }
