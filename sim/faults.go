package sim

import (
	"fmt"
	"time"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// setup creates the sale at every region (gen 1) and the ledger's SKUs, and allocates each
// SKU by the shape's weights (40/35/25 by default) through transfers from the unallocated
// pool, as `sale create --allocate` does.
func (w *world) setup() {
	terms := region.SaleTerms{Sale: sale, SKUs: w.shape.skus, PerUserLimit: 3, HoldTTL: holdTTL, OpensAt: epoch}
	for _, name := range w.shape.regions {
		r := w.regions[name]
		if err := r.leader.live.PutSale(1, terms); err != nil {
			panic(fmt.Sprintf("sim: put sale: %v", err))
		}
		r.durable = r.leader.live.Clone()
	}
	weights := w.shape.weights
	for _, sku := range w.shape.skus {
		w.ledger.total[sku], w.ledger.unallocated[sku] = w.cfg.Total, w.cfg.Total
		split, err := transfer.Split(w.cfg.Total, weights)
		if err != nil {
			panic(fmt.Sprintf("sim: split: %v", err))
		}
		for i, wt := range weights {
			w.createTransfer(fmt.Sprintf("allocate/%s/%s", sku, wt.Region), sku, transfer.Unallocated, wt.Region, split[i])
		}
	}
}

// createTransfer records a transfer at the leading coordinator and drives it at once, as
// Coordinator.Transfer (and Allocate) do; the background rounds take it on from there.
func (w *world) createTransfer(id, sku, from, to string, units transfer.Units) {
	if units <= 0 {
		return
	}
	c := w.coords[w.leader]
	if !c.leading(w) {
		return
	}
	t := transfer.Transfer{ID: id, Sale: sale, SKU: sku, From: from, To: to, Units: units}
	if err := w.ledger.create(c.gen, w.now, t); err != nil {
		return
	}
	w.stats.Ops["transfer"]++
	if to == transfer.Unallocated {
		w.stats.Ops["transfer to the unallocated pool"]++
	}
	c.start(w, w.ledger.transfers[id], false, false)
}

// nemesis injects at most one process fault per step.
func (w *world) nemesis() {
	switch x := w.rng.Float64(); {
	case x < 0.004:
		r := w.regions[pick(w, w.shape.regions)]
		if r.up {
			w.stats.Faults["region crash"]++
			r.crash(w)
		}
	case x < 0.008:
		name := pick(w, w.procs)
		w.net.cut = mapSet(w.net.cut, name, w.now.Add(w.between(500*time.Millisecond, 8*time.Second)))
		w.stats.Faults["link cut"]++
	case x < 0.010:
		w.changeLeader(w.between(0, 3*time.Second))
	case x < 0.012:
		if r := w.regions[pick(w, w.shape.regions)]; r.up && r.deposed == nil {
			r.changeLeader(w, w.between(100*time.Millisecond, 3*time.Second))
		}
	}
}

// changeLeader moves coordinator leadership to the other node with the next generation.
// The old leader stops at once (zombie 0: it crashed) or goes on for a while with its old
// generation (paused past its lease).
func (w *world) changeLeader(zombie time.Duration) {
	old := w.coords[w.leader]
	old.depose(w.now, zombie)
	if zombie > 0 {
		w.stats.Faults["coordinator deposed (zombie)"]++
	} else {
		w.stats.Faults["coordinator crash"]++
	}
	w.leader = 1 - w.leader
	w.gen++
	w.coords[w.leader].lead(w.gen)
}

func mapSet(m map[string]time.Time, k string, v time.Time) map[string]time.Time {
	if m == nil {
		m = map[string]time.Time{}
	}
	m[k] = v
	return m
}

// operator moves stock by hand (between w.pools: the regions, and the unallocated pool,
// where stock returns to the centre and is allocated again, each drawn with the same
// odds), rebalances by the policy, runs rounds of the automatic
// rebalancer, and now and then resolves a stranded transfer with --refuse (Coordinator.Resolve: a pending one is refused at its
// destination, a requested one at its source).
func (w *world) operator() {
	switch x := w.rng.Float64(); {
	case x < 0.01:
		from, to := pick(w, w.pools), pick(w, w.pools)
		if from != to {
			w.createTransfer(fmt.Sprintf("t%d", w.nextID()), w.pickSKU(), from, to, transfer.Units(1+w.rng.IntN(20)))
		}
	case x < 0.013:
		w.rebalance(w.pickSKU())
	case x < 0.016:
		w.resolveRefuse()
	case x < 0.026:
		w.autoRebalance(w.pickSKU())
	}
}

func (w *world) resolveRefuse() {
	c := w.coords[w.leader]
	if !c.leading(w) {
		return
	}
	var stranded []transfer.Transfer
	for _, t := range w.ledger.unfinished() {
		if t.Stranded && !t.State.Final() {
			stranded = append(stranded, t)
		}
	}
	if len(stranded) == 0 {
		return
	}
	t := pick(w, stranded)
	w.stats.Ops["resolve --refuse ("+string(t.State)+")"]++
	c.start(w, t, true, false)
}

// rebalancePolicy is the rebalancers' rule in the simulation, scaled to its seconds.
var rebalancePolicy = transfer.Policy{Window: 5 * time.Second, Horizon: 10 * time.Second, MinUnits: 2}

// maxAutoInFlight caps the automatic rebalancer's moves: it starts none while a SKU has
// that many transfers unfinished (the coordinator's Auto.MaxInFlight).
const maxAutoInFlight = 4

// demand is each readable region's available units of sku and its reservations within
// window, from its durable books, as the rebalancers read them (the coordinator's poolsOf).
// A region the leading coordinator cannot read (down, or either's links cut) is left out of
// the plan, as readPoolDemand leaves out one that does not answer.
func (w *world) demand(sku string, window time.Duration) []transfer.PoolDemand {
	var pools []transfer.PoolDemand
	for _, name := range w.shape.regions {
		r := w.regions[name]
		if !r.up || w.isCut(name) || w.isCut(w.coords[w.leader].name) {
			continue
		}
		d := transfer.PoolDemand{Pool: name}
		for _, p := range r.durable.Pools() {
			if p.SKU == sku {
				d.Available = p.Available
			}
		}
		for _, h := range r.durable.Holds() {
			if h.SKU == sku && w.now.Sub(h.CreatedAt) <= window {
				d.Recent += h.Quantity
			}
		}
		pools = append(pools, d)
	}
	return pools
}

// rebalance plans moves from the regions' durable books and recent reservations, as
// `quotactl rebalance` does.
func (w *world) rebalance(sku string) {
	w.stats.Ops["rebalance"]++
	for _, m := range rebalancePolicy.Plan(w.demand(sku, rebalancePolicy.Window)) {
		w.createTransfer(fmt.Sprintf("rebalance/%d", w.nextID()), sku, m.From, m.To, m.Units)
	}
}

// autoRebalance is one round of the automatic rebalancer for sku, planned as the
// coordinator plans it: the unallocated pool and the regions' demand (demand), the SKU's
// unfinished transfers and those posted within the window (the coordinator's
// openTransfersOf, in the order they were created), the policy's window shortened to the
// time the sale has been open, and the rule itself, transfer.Policy.AutoRound. Its moves
// start as fenced transfers, as many as the cap on transfers in flight leaves room for.
func (w *world) autoRebalance(sku string) {
	pools := append([]transfer.PoolDemand{{Pool: transfer.Unallocated, Available: w.ledger.unallocated[sku]}},
		w.demand(sku, rebalancePolicy.Window)...)
	w.stats.Ops["auto-rebalance round"]++
	r := rebalancePolicy.SinceOpening(epoch, w.now).AutoRound(pools, w.ledger.recent(sku, w.now.Add(-rebalancePolicy.Window)))
	for _, m := range r.Moves[:min(len(r.Moves), max(0, maxAutoInFlight-r.InFlight))] {
		w.createTransfer(fmt.Sprintf("auto/%d", w.nextID()), sku, m.From, m.To, m.Units)
		w.stats.Ops["auto-rebalance move"]++
	}
}

// heal ends every fault, lets the coordinator finish every transfer and the buyers' holds
// run out, then requires the final audit to be exact: nothing in flight, every transfer
// posted or voided.
func (w *world) heal() {
	w.faults = false
	w.net.cut = nil
	for _, c := range w.coords {
		if c != w.coords[w.leader] {
			c.stop()
		}
	}
	for _, name := range w.shape.regions {
		w.regions[name].deposed = nil
	}
	for i := 0; i < healSteps && w.fail == nil; i++ {
		w.step++
		w.tick(false)
		if len(w.ledger.unfinished()) == 0 && len(w.net.flying) == 0 && w.allUp() {
			break
		}
	}
	if w.fail != nil {
		return
	}
	for _, t := range w.ledger.unfinished() {
		w.failf("heal", "transfer %s is still %s (settled %v, stranded %v) after healing", t.ID, t.State, t.Settled, t.Stranded)
		return
	}
	w.check(true)
}

func (w *world) allUp() bool {
	for _, r := range w.regions {
		if !r.up {
			return false
		}
	}
	return true
}
