package bench

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/coordinator"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// AuditPoint is one point of the audit curve: a sale with Transfers transfers (its
// allocation's included) and Holds sold holds over three regions.
type AuditPoint struct {
	Transfers int   `json:"transfers"`
	Holds     int64 `json:"holds"`
	// Ms is the median of the timed audits, Runs each of them (ms).
	Ms   float64   `json:"ms"`
	Runs []float64 `json:"runs_ms"`
	// OK is the audit's verdict; it must be true.
	OK         bool `json:"ok"`
	Violations int  `json:"violations"`
}

// auditSale is the audit curve's sale; auditUnits its units (enough for every transfer and hold).
const (
	auditSale  = "audit"
	auditUnits = 90_000_000
)

// runAuditCurve grows one sale's transfers (one unit each, round the three regions, 16 at
// a time), then its stored holds, and times the coordinator's Audit at each point.
func runAuditCurve(ctx context.Context, cfg *ScaleConfig, dbs *databases) ([]AuditPoint, error) {
	cfg.progress("audit: starting a cluster of %v", scaleRegions)
	g, err := startScaleRig(ctx, cfg, dbs, "au", scaleRegions, false, 0)
	if err != nil {
		return nil, err
	}
	defer g.close()
	if err := g.createSale(ctx, auditSale, []string{"sku"}, auditUnits, coordinator.RebalanceManual, []int64{1, 1, 1}); err != nil {
		return nil, err
	}
	var out []AuditPoint
	made := len(scaleRegions) // the allocation's
	for _, n := range cfg.Transfers {
		if err := g.auditTransfers(ctx, cfg, made, n); err != nil {
			return out, err
		}
		made = max(made, n)
		p, err := g.timeAudit(ctx, cfg, made, 0)
		out = append(out, p)
		if err != nil {
			return out, err
		}
	}
	var stored int64
	for _, h := range cfg.AuditHolds {
		if err := g.storeAuditHolds(ctx, stored, h); err != nil {
			return out, err
		}
		stored = max(stored, h)
		p, err := g.timeAudit(ctx, cfg, made, stored)
		out = append(out, p)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// transfers makes transfers from..to-1 of one unit each, region i%3 to region (i+1)%3.
func (g *scaleRig) transfers(ctx context.Context, from, to, width int) error {
	if to <= from {
		return nil
	}
	return inParallel(ctx, to-from, width, func(ctx context.Context, i int) error {
		n := from + i
		src, dst := scaleRegions[n%3], scaleRegions[(n+1)%3]
		tr, err := g.coord.Transfer(ctx, &quotav1.TransferRequest{SaleId: auditSale, Sku: "sku", From: src, To: dst, Units: 1,
			RequestId: "t-" + strconv.Itoa(n)})
		if err != nil {
			return fmt.Errorf("transfer %d: %w", n, err)
		}
		if st := tr.GetTransfer().GetState(); st != "posted" {
			return fmt.Errorf("transfer %d is %s, not posted", n, st)
		}
		return nil
	})
}

// timeAudit audits the sale cfg.AuditRuns times and answers the median time.
func (g *scaleRig) timeAudit(ctx context.Context, cfg *ScaleConfig, transfers int, holds int64) (AuditPoint, error) {
	p := AuditPoint{Transfers: transfers, Holds: holds, OK: true}
	for range cfg.AuditRuns {
		t0 := time.Now()
		rep, err := g.coord.Audit(ctx, &quotav1.AuditRequest{SaleId: auditSale})
		if err != nil {
			return p, fmt.Errorf("audit: %w", err)
		}
		p.Runs = append(p.Runs, round1(float64(time.Since(t0).Microseconds())/1000))
		p.OK = p.OK && rep.GetOk()
		p.Violations = max(p.Violations, len(rep.GetViolations()))
	}
	sorted := slices.Clone(p.Runs)
	sort.Float64s(sorted)
	p.Ms = sorted[len(sorted)/2]
	cfg.progress("audit: %d transfers, %d holds: %.1f ms (median of %d), ok %v", transfers, holds, p.Ms, cfg.AuditRuns, p.OK)
	if !p.OK {
		return p, fmt.Errorf("audit at %d transfers and %d holds found %d violations", transfers, holds, p.Violations)
	}
	return p, nil
}

// storeAuditHolds writes holds from..to-1 of the audit sale as sold holds straight into the
// regions' databases (a third each), moving their units from available to sold in the same
// transaction, so the books stay balanced. The region leaders' memory does not see them:
// nothing reserves from this sale, and the writer only ever adds deltas to a pool's counts.
func (g *scaleRig) storeAuditHolds(ctx context.Context, from, to int64) error {
	for i, r := range g.dev.Regions {
		lo, hi := from+(to-from)*int64(i)/3, from+(to-from)*int64(i+1)/3
		if err := insertClosedHolds(ctx, r.DB, auditSale, "sku", r.R.Name()+"-a", lo, hi, true); err != nil {
			return fmt.Errorf("region %s: %w", r.R.Name(), err)
		}
	}
	return nil
}

// insertClosedHolds stores holds lo..hi-1 of (sale, sku) as sold an hour ago (past any
// retention), with ids, users and keys named after tag and the number, in batches of
// 100,000 rows; with fromAvailable their units come out of the pool's available, otherwise
// they are credited to the pool first (as if allocated and sold).
func insertClosedHolds(ctx context.Context, db *pgxpool.Pool, sale, sku, tag string, lo, hi int64, fromAvailable bool) error {
	const chunk = 100_000
	set := `available = available - n.c, sold = sold + n.c`
	if !fromAvailable {
		set = `credited_in = credited_in + n.c, sold = sold + n.c`
	}
	for a := lo; a < hi; a += chunk {
		b := min(hi, a+chunk)
		res, err := db.Exec(ctx, `WITH ins AS (INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash,
				state, created_at, expires_at, closed_at, payment_id, changed)
			SELECT $3 || '.' || g, $1, $2, $3 || '-u' || g, 1, 'k', md5($3 || g::text), 'sold', now() - interval '2 hours',
				now() + interval '1 hour', now() - interval '1 hour', 'pay-' || g, 0
			FROM generate_series($4::bigint, $5::bigint - 1) g RETURNING 1),
			n AS (SELECT count(*) AS c FROM ins)
			UPDATE pools SET `+set+` FROM n WHERE sale_id = $1 AND sku = $2`, sale, sku, tag, a, b)
		if err != nil {
			return fmt.Errorf("store holds %d..%d: %w", a, b, err)
		}
		if res.RowsAffected() != 1 {
			return fmt.Errorf("store holds %d..%d: no pool %s/%s", a, b, sale, sku)
		}
	}
	return nil
}
