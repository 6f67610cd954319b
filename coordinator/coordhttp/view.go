package coordhttp

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/transfer"
)

const (
	// viewTTL is how long a sale's view is served before it is read again: every viewer's
	// page polls, and all of them together cost one read of the ledger and the regions per
	// viewTTL per sale.
	viewTTL = time.Second
	// auditTTL is how long a sale's audit is reused: an audit reads every region's books.
	auditTTL = 5 * time.Second
	// maxViews bounds the cached sales; the cache starts over past it.
	maxViews = 64
	// demandWindow is how far back the demand per second is measured.
	demandWindow = 10 * time.Second
	// maxPlanSKUs bounds the SKUs a view plans for (each plan reads every region).
	maxPlanSKUs = 16
	// maxTransfers bounds the transfers a view lists (stranded ones first).
	maxTransfers = 200
	// maxSales bounds the overview's sales (newest first).
	maxSales = 200
	// lastRounds is how many of the continuous audit's stored rounds the overview shows.
	lastRounds = 5
	// readTimeout bounds one view's reads.
	readTimeout = 10 * time.Second
)

// viewCache keeps each sale's view for viewTTL and its audit for auditTTL. One reader per
// sale at a time: viewers that ask meanwhile wait for its view instead of reading again.
type viewCache struct {
	mu    sync.Mutex
	sales map[string]*cachedView
}

type cachedView struct {
	mu      sync.Mutex
	view    *saleView
	at      time.Time
	audit   *auditJSON
	auditAt time.Time
}

func newViewCache() *viewCache { return &viewCache{sales: map[string]*cachedView{}} }

func (c *viewCache) entry(sale string) *cachedView {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.sales[sale]
	if !ok {
		if len(c.sales) >= maxViews {
			clear(c.sales)
		}
		e = &cachedView{}
		c.sales[sale] = e
	}
	return e
}

// forget drops a sale's view, so the next poll shows a change just made.
func (c *viewCache) forget(sale string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sales, sale)
}

// overviewJSON is GET api/overview.
type overviewJSON struct {
	Leading bool           `json:"leading"`
	Audit   continuousJS   `json:"continuous_audit"`
	Sales   []saleLineJSON `json:"sales"`
	// Rounds are the continuous audit's last stored rounds, newest first.
	Rounds []roundJSON `json:"rounds"`
}

// roundJSON is one stored round of the continuous audit, with its violations' evidence.
type roundJSON struct {
	Round      int64           `json:"round_id"`
	At         time.Time       `json:"at"`
	OK         bool            `json:"ok"`
	SKUs       int             `json:"skus"`
	Error      string          `json:"error,omitempty"`
	Violations []violationJSON `json:"violations"`
}

type continuousJS struct {
	Violations int64     `json:"violations"`
	At         time.Time `json:"at,omitzero"`
}

type saleLineJSON struct {
	Sale        string    `json:"sale"`
	CreatedAt   time.Time `json:"created_at"`
	OpensAt     time.Time `json:"opens_at"`
	SKUs        int       `json:"skus"`
	Total       int64     `json:"total"`
	Unallocated int64     `json:"unallocated"`
	Paused      int       `json:"paused"`
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request, _ session) error {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	sales, err := h.b.ListSales(ctx, maxSales)
	if err != nil {
		return err
	}
	_, gerr := h.b.Generation()
	out := overviewJSON{Leading: gerr == nil, Audit: continuousJS{h.b.AuditViolations(), h.b.AuditedAt()}, Sales: []saleLineJSON{}}
	for _, s := range sales {
		out.Sales = append(out.Sales, saleLineJSON{s.Sale, s.CreatedAt, s.OpensAt, s.SKUs, int64(s.Total), int64(s.Unallocated), s.Paused})
	}
	if out.Rounds, err = h.lastRounds(ctx); err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (h *handler) saleView(w http.ResponseWriter, r *http.Request, _ session) error {
	sale := r.PathValue("sale")
	e := h.views.entry(sale)
	e.mu.Lock()
	defer e.mu.Unlock()
	now := h.opts.Now()
	if e.view == nil || now.Sub(e.at) >= viewTTL {
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		v, err := h.readSale(ctx, sale, now)
		if err != nil {
			return err
		}
		if e.audit == nil || now.Sub(e.auditAt) >= auditTTL {
			e.audit, e.auditAt = h.readAudit(ctx, sale), now
		}
		e.view, e.at = v, now
	}
	v := *e.view
	v.Audit = e.audit
	rpcserve.WriteJSON(w, http.StatusOK, v)
	return nil
}

// readSale reads one sale's view: the ledger's sale, every region's pools and recent
// demand, the transfers and the plan.
func (h *handler) readSale(ctx context.Context, sale string, now time.Time) (*saleView, error) {
	s, err := h.b.GetSale(ctx, sale)
	if err != nil {
		return nil, err
	}
	v := &saleView{Sale: sale, CreatedAt: s.CreatedAt, OpensAt: s.Terms.OpensAt, PerUserLimit: int64(s.Terms.PerUserLimit),
		At: now, DemandWindowSec: demandWindow.Seconds(), Regions: []string{}, Pauses: []pauseJSON{}, SKUs: []skuView{}, Errors: []string{}}
	for _, p := range s.Pauses {
		if p.Paused {
			v.Pauses = append(v.Pauses, pauseJSON{SKU: p.SKU, Reason: p.Reason, ChangedAt: p.ChangedAt})
		}
	}
	for _, k := range s.SKUs {
		v.SKUs = append(v.SKUs, skuView{SKU: k.SKU, Total: int64(k.Total), Unallocated: int64(k.Unallocated),
			Paused: paused(s.Pauses, k.SKU), Pools: []poolView{}})
	}
	h.readPools(ctx, v, sale, now)
	ts, err := h.b.RecentTransfers(ctx, sale, maxTransfers)
	if err != nil {
		return nil, err
	}
	v.Transfers = []transferJSON{}
	for _, t := range ts {
		v.Transfers = append(v.Transfers, toTransferJSON(t, now))
	}
	v.Plans = h.readPlans(ctx, v)
	return v, nil
}

// paused reports whether a pause of the sale or of sku is in force.
func paused(ps []coordinator.Pause, sku string) bool {
	for _, p := range ps {
		if p.Paused && (p.SKU == "" || p.SKU == sku) {
			return true
		}
	}
	return false
}

// readPools reads every region's pools of the sale and their demand over demandWindow. A
// region that cannot be read is named in the view's errors and its pools left out.
func (h *handler) readPools(ctx context.Context, v *saleView, sale string, now time.Time) {
	allRead := true
	for _, r := range h.b.Regions() {
		v.Regions = append(v.Regions, r.Name)
		books, err := r.Books(ctx, sale)
		if err != nil {
			v.Errors = append(v.Errors, "region "+r.Name+": "+err.Error())
			allRead = false
			continue
		}
		var demand map[string]transfer.Units
		if r.Demand != nil {
			if demand, err = r.Demand(ctx, sale, now.Add(-demandWindow)); err != nil {
				v.Errors = append(v.Errors, "region "+r.Name+" demand: "+err.Error())
			}
		}
		for _, p := range books.Pools {
			for i := range v.SKUs {
				if v.SKUs[i].SKU == p.SKU {
					v.SKUs[i].Pools = append(v.SKUs[i].Pools, toPoolView(r.Name, p, demand[p.SKU]))
				}
			}
		}
	}
	for i := range v.SKUs {
		k := &v.SKUs[i]
		var unsold int64
		for _, p := range k.Pools {
			unsold += p.Available + p.Held
		}
		k.SoldOut = allRead && k.Unallocated == 0 && unsold == 0
	}
}

func toPoolView(region string, p transfer.PoolBooks, recent transfer.Units) poolView {
	pv := poolView{Region: region, Available: int64(p.Available), Held: int64(p.Held), Sold: int64(p.Sold),
		DemandPerSec: float64(recent) / demandWindow.Seconds(), Exhausted: p.Available == 0}
	if pv.DemandPerSec > 0 {
		secs := float64(p.Available) / pv.DemandPerSec
		pv.EmptyInSec = &secs
	}
	return pv
}

// readPlans asks the coordinator's automatic rebalancer what it would do next for each SKU
// and why (Coordinator.PlanRebalance: it reads, nothing moves), for the first maxPlanSKUs
// SKUs.
func (h *handler) readPlans(ctx context.Context, v *saleView) []planJSON {
	plans := []planJSON{}
	plan, err := h.b.PlanRebalance(ctx, v.Sale)
	if err != nil {
		return append(plans, planJSON{Pools: []planPoolJSON{}, Moves: []moveJSON{}, Error: err.Error()})
	}
	for i, k := range plan.SKUs {
		if i == maxPlanSKUs {
			break
		}
		p := planJSON{SKU: k.SKU, Mode: string(plan.Mode), Enabled: plan.Enabled, NearSellOut: k.NearSellOut,
			InFlight: k.InFlight, Held: k.Held, Pools: []planPoolJSON{}, Moves: []moveJSON{}}
		for _, d := range k.Pools {
			pp := planPoolJSON{Pool: d.Pool, Available: int64(d.Available), Incoming: int64(d.Incoming), Recent: int64(d.Recent),
				Need: int64(d.Need), PerSecond: d.Projection.PerSecond, Frozen: d.Frozen}
			if d.Projection.EmptyIn >= 0 {
				secs := d.Projection.EmptyIn.Seconds()
				pp.EmptyInSec = &secs
			}
			p.Pools = append(p.Pools, pp)
		}
		for _, m := range k.Moves {
			p.Moves = append(p.Moves, moveJSON{m.From, m.To, int64(m.Units)})
		}
		plans = append(plans, p)
	}
	return plans
}

// readAudit runs the coordinator's audit of the sale; an audit that cannot run is reported
// in the view, not as the view's failure.
func (h *handler) readAudit(ctx context.Context, sale string) *auditJSON {
	a := &auditJSON{Violations: []violationJSON{}, Continuous: continuousJS{h.b.AuditViolations(), h.b.AuditedAt()}}
	rep, err := h.b.Audit(ctx, sale)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	a.OK, a.At, a.Ran = rep.OK, rep.At, true
	for _, viol := range rep.Violations {
		a.Violations = append(a.Violations, violationJSON{viol.Invariant, viol.SKU, viol.Region, viol.Detail})
	}
	for _, k := range rep.SKUs {
		a.SKUs = append(a.SKUs, auditSKUJSON{k.SKU, int64(k.Total), int64(k.Unallocated), int64(k.Available), int64(k.Held),
			int64(k.Sold), int64(k.InFlight), int64(k.Stranded), k.OK})
	}
	return a
}

// lastRounds reads the continuous audit's last stored rounds, without their sales.
func (h *handler) lastRounds(ctx context.Context) ([]roundJSON, error) {
	rounds, _, err := h.b.AuditHistory(ctx, coordinator.AuditHistoryQuery{Limit: lastRounds, RoundsOnly: true})
	if err != nil {
		return nil, err
	}
	out := make([]roundJSON, 0, len(rounds))
	for _, r := range rounds {
		rj := roundJSON{Round: r.ID, At: r.At, OK: r.OK, SKUs: r.SKUs, Error: r.Error, Violations: []violationJSON{}}
		for _, v := range r.Violations {
			rj.Violations = append(rj.Violations, violationJSON{v.Invariant, v.Sale + "/" + v.SKU, v.Region, v.Detail})
		}
		out = append(out, rj)
	}
	return out, nil
}
