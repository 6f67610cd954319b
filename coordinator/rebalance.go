package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// DemandReader reads, per SKU, the units reserved at a region since a time, straight from the
// region's database (region.RecentDemand).
type DemandReader func(ctx context.Context, sale string, since time.Time) (map[string]transfer.Units, error)

// RebalanceRequest asks for a plan (and, unless DryRun, its transfers) for one SKU.
type RebalanceRequest struct {
	Sale, SKU string
	Policy    transfer.Policy
	DryRun    bool
	// RequestID prefixes the planned transfers' request ids (<id>-0, <id>-1, ...). A rebalance
	// whose id made transfers before replays them instead of planning again, so a retry after
	// a lost reply shows what the first call did and moves nothing more; default: one per
	// minute.
	RequestID string
	// Auto plans with the automatic rebalancer's rule and settings (transfer.Policy.AutoPlan:
	// units on their way, frozen pools, near sell-out sharing and crumbs) instead of Policy,
	// which is then ignored: what the console's "apply" runs.
	Auto bool
}

// RebalanceResult is the input the plan was made from, the plan, and the transfers run.
type RebalanceResult struct {
	Pools     []transfer.PoolDemand
	Moves     []transfer.Move
	Transfers []transfer.Transfer
	Replayed  bool // the transfers are the request id's earlier ones; nothing was planned
}

// Rebalance plans moves of one SKU toward the regions selling fastest (transfer.Policy)
// and, unless DryRun, runs them as transfers. A region whose database cannot be read is left
// out of the plan, neither source nor destination: its pool is never reassigned.
func (c *Coordinator) Rebalance(ctx context.Context, req RebalanceRequest) (RebalanceResult, error) {
	return c.rebal.rebalance(ctx, req)
}

// rebalance is Rebalance.
func (rb *rebalancer) rebalance(ctx context.Context, req RebalanceRequest) (RebalanceResult, error) {
	var res RebalanceResult
	if err := checkSaleID(req.Sale); err != nil {
		return res, err
	}
	if why := transfer.CheckID(req.SKU); why != "" {
		return res, apierr.Invalid("sku", "%s", why)
	}
	if req.Auto {
		req.Policy = rb.cfg.Auto.Policy
	}
	p := req.Policy
	if p.Window <= 0 || p.Horizon <= 0 || p.MinUnits <= 0 {
		return res, apierr.Invalid("policy", "window, horizon and min units must be positive")
	}
	sale, err := rb.ledger.sale(ctx, req.Sale)
	if err != nil {
		return res, err
	}
	found := false
	for _, k := range sale.SKUs {
		if k.SKU == req.SKU {
			found = true
			res.Pools = append(res.Pools, transfer.PoolDemand{Pool: transfer.Unallocated, Available: k.Unallocated})
		}
	}
	if !found {
		return res, fmt.Errorf("sale %q has no sku %q: %w", req.Sale, req.SKU, ErrNotFound)
	}
	since := rb.cfg.Clock.Now().Add(-p.Window)
	for _, r := range rb.cfg.Regions {
		avail, recent, err := rb.poolsOf(ctx, r, req.Sale, since)
		if err != nil {
			rb.cfg.Logger.Warn("rebalance: region unreadable, left out", "region", r.Name, "err", err)
			continue
		}
		res.Pools = append(res.Pools, transfer.PoolDemand{Pool: r.Name, Available: avail[req.SKU], Recent: recent[req.SKU]})
	}
	if req.RequestID != "" && !req.DryRun {
		earlier, err := rb.earlierTransfers(ctx, req)
		if err != nil || len(earlier) > 0 {
			res.Transfers, res.Replayed = earlier, len(earlier) > 0
			for _, t := range earlier {
				res.Moves = append(res.Moves, transfer.Move{From: t.From, To: t.To, Units: t.Units})
			}
			return res, err
		}
	}
	if res.Moves, err = rb.planMoves(ctx, req, sale, res.Pools); err != nil || req.DryRun {
		return res, err
	}
	prefix := req.RequestID
	if prefix == "" {
		prefix = fmt.Sprintf("rebalance-%s-%s-%s", req.Sale, req.SKU, rb.cfg.Clock.Now().UTC().Format("20060102T1504"))
	}
	for i, m := range res.Moves {
		t, _, err := rb.transfer(ctx, TransferRequest{Sale: req.Sale, SKU: req.SKU, From: m.From, To: m.To, Units: m.Units,
			RequestID: fmt.Sprintf("%s-%d", prefix, i)})
		if err != nil {
			return res, fmt.Errorf("move %d (%d %s → %s): %w", i, m.Units, m.From, m.To, err)
		}
		res.Transfers = append(res.Transfers, t)
	}
	return res, nil
}

// planMoves is a rebalance's moves: Policy.Plan's, or with Auto the automatic rebalancer's,
// which like its own rounds moves nothing of a paused SKU and starts no more transfers than
// the cap on transfers in flight leaves room for.
func (rb *rebalancer) planMoves(ctx context.Context, req RebalanceRequest, sale Sale, pools []transfer.PoolDemand) ([]transfer.Move, error) {
	if !req.Auto {
		return req.Policy.Plan(pools), nil
	}
	if pausedSKU(sale.Pauses, req.SKU) {
		return nil, fmt.Errorf("sale %s sku %s is paused: the rebalancer moves none of its units: %w", req.Sale, req.SKU, apierr.ErrPaused)
	}
	open, err := rb.openTransfersOf(ctx, req.Sale, rb.cfg.Clock.Now().Add(-rb.cfg.Auto.Policy.Window))
	if err != nil {
		return nil, err
	}
	sp := planSKU(rb.cfg.Auto.Policy.SinceOpening(sale.Terms.OpensAt, rb.cfg.Clock.Now()), req.SKU, pools, open[req.SKU])
	room := max(rb.cfg.Auto.MaxInFlight-sp.InFlight, 0)
	return sp.Moves[:min(room, len(sp.Moves))], nil
}

// earlierTransfers are the transfers an earlier rebalance of req's sale and SKU made under
// req's request id (request ids <id>-<n>), in the order it planned them.
func (rb *rebalancer) earlierTransfers(ctx context.Context, req RebalanceRequest) ([]transfer.Transfer, error) {
	rows, err := rb.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE sale_id = $1 AND sku = $2 AND starts_with(request_id, $3)
		AND substr(request_id, length($3) + 1) ~ '^[0-9]{1,9}$'
		ORDER BY substr(request_id, length($3) + 1)::bigint`, req.Sale, req.SKU, transferRequestPrefix+req.RequestID+"-")
	if err != nil {
		return nil, fmt.Errorf("read the request id's transfers: %w", err)
	}
	return pgx.CollectRows(rows, scanTransfer)
}
