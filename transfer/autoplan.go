package transfer

import (
	"math"
	"slices"
	"sort"
	"time"
)

// The automatic rebalancer's rule, as pure functions of what it read: each pool's stock,
// its recent demand, the units already on their way to it and whether a stranded transfer
// froze it as a source. The coordinator reads, this file decides, the coordinator moves
// (through the same fenced transfers as any other: I1..I4 hold as for an operator's move).

// PoolPlan is one pool in a round's plan: what was read of it (with the SKU's transfers
// counted in, AutoRound) and what the plan expects of it.
type PoolPlan struct {
	PoolDemand
	// Need is what the pool should hold (Targets): its need over the horizon, or near
	// sell-out its share of what is left by demand.
	Need       Units
	Projection Projection
}

// Round is one SKU's plan in a round of the automatic rebalancer: its pools as the plan
// saw them, whether it is near sell-out, how many of its transfers are unfinished, and the
// moves the rule wants (before any cap on transfers in flight).
type Round struct {
	Pools       []PoolPlan
	NearSellOut bool
	InFlight    int
	Moves       []Move
}

// AutoRound is one SKU's plan under p from the pools as read (the unallocated pool and each
// region's available units and recent demand) and the SKU's recent transfers: the unfinished
// ones (requested or pending) and those posted within the window. A requested transfer's
// units are counted as gone from its source and on their way to its destination, a pending
// one's as on their way; an unfinished stranded transfer freezes its source; a transfer
// posted from another region marks its destination fed (it gives nothing back yet: no back
// and forth on a noisy rate). The coordinator's rounds, PlanRebalance and rebalance --auto
// call it, and so does the deterministic simulation. pools is not modified.
func (p Policy) AutoRound(pools []PoolDemand, recent []Transfer) Round {
	pools = slices.Clone(pools)
	inFlight := 0
	for _, t := range recent {
		open := t.State == Requested || t.State == Pending
		if open {
			inFlight++
		}
		for i := range pools {
			switch d := &pools[i]; {
			case open && t.To == d.Pool:
				d.Incoming += t.Units
			case t.State == Requested && t.From == d.Pool:
				d.Available = max(d.Available-t.Units, 0)
				d.Frozen = d.Frozen || t.Stranded
			case open && t.From == d.Pool:
				d.Frozen = d.Frozen || t.Stranded
			case t.State == Posted && t.To == d.Pool && t.From != Unallocated:
				d.Fed = true
			}
		}
	}
	r := Round{NearSellOut: p.NearSellOut(pools), InFlight: inFlight, Moves: p.AutoPlan(pools)}
	targets := p.Targets(pools)
	for i, d := range pools {
		r.Pools = append(r.Pools, PoolPlan{PoolDemand: d, Need: targets[i], Projection: p.Project(d)})
	}
	return r
}

// MinRateWindow is the shortest window a rate is measured over (SinceOpening).
const MinRateWindow = time.Second

// SinceOpening is p for a sale that opened at opensAt, at now: its window shortened to the
// time the sale has been open (but not below MinRateWindow), so that the first seconds' rate
// is not diluted over a window the sale was closed for most of: buyers rush in at the
// opening.
func (p Policy) SinceOpening(opensAt, now time.Time) Policy {
	if open := now.Sub(opensAt); open < p.Window {
		p.Window = max(open, min(MinRateWindow, p.Window))
	}
	return p
}

// Projection is one pool's demand as a rate and the time its stock lasts at that rate.
type Projection struct {
	// PerSecond is the units reserved per second over the policy's window.
	PerSecond float64
	// EmptyIn is how long the pool's available and incoming units last at that rate;
	// negative when nothing is reserved there (the pool never runs out).
	EmptyIn time.Duration
}

// Project is d's rate and time to empty under p.
func (p Policy) Project(d PoolDemand) Projection {
	if p.Window <= 0 || d.Recent <= 0 || d.Pool == Unallocated {
		return Projection{EmptyIn: -1}
	}
	rate := float64(d.Recent) / p.Window.Seconds()
	secs := float64(d.Available+d.Incoming) / rate
	return Projection{PerSecond: rate, EmptyIn: time.Duration(math.Min(secs, float64(math.MaxInt64/int64(time.Second))) * float64(time.Second))}
}

// NearSellOut reports whether the SKU's units, wherever they are, are fewer than the
// regions expect to sell within the horizon: the sale is about to sell out, and the last
// units ("crumbs") should stand where buyers still are.
func (p Policy) NearSellOut(pools []PoolDemand) bool {
	var have, need Units
	for _, d := range pools {
		have += d.Available + d.Incoming
		if d.Pool != Unallocated {
			need += p.Need(d)
		}
	}
	return need > 0 && have <= need
}

// Targets is what each pool should hold, in pools' order: its need over the horizon; or,
// near sell-out, its share of every unit left (available and on its way, the unallocated
// pool's included) by its recent demand, so that every pool runs out at about the same time
// and no buyer is turned away at one region while another still has units. The
// unallocated pool's target is 0.
func (p Policy) Targets(pools []PoolDemand) []Units {
	out := make([]Units, len(pools))
	near := p.NearSellOut(pools)
	var left, demand Units
	for _, d := range pools {
		left += d.Available + d.Incoming
		if d.Pool != Unallocated {
			demand += d.Recent
		}
	}
	for i, d := range pools {
		switch {
		case d.Pool == Unallocated:
		case near && demand > 0:
			out[i] = Units(int64(left) * int64(d.Recent) / int64(demand))
		default:
			out[i] = p.Need(d)
		}
	}
	return out
}

// AutoPlan is the automatic rebalancer's plan: it matches what pools hold above their
// Targets to what others lack, the lacks served in the order the pools would run out
// (soonest first), frozen and fed pools giving nothing, units already on their way counted at their
// destination; near sell-out, the pools whose buyers went quiet give their last units
// ("crumbs") to the pools whose buyers are still arriving, below MinUnits too. Only
// available units move, never held ones (I2: a hold keeps its unit). Deterministic for the
// same input.
func (p Policy) AutoPlan(pools []PoolDemand) []Move {
	crumbs := p.NearSellOut(pools)
	targets := p.Targets(pools)
	var donors, takers []side
	for i, d := range pools {
		have := d.Available + d.Incoming
		if spare := min(have-targets[i], d.Available); spare > 0 && !d.Frozen && !d.Fed {
			donors = append(donors, side{pool: d.Pool, units: spare, quiet: d.Recent == 0})
		}
		if d.Pool != Unallocated && targets[i] > have {
			takers = append(takers, side{pool: d.Pool, units: targets[i] - have, emptyIn: p.Project(d).EmptyIn})
		}
	}
	sort.SliceStable(donors, func(i, j int) bool { return donors[i].before(donors[j]) })
	sort.SliceStable(takers, func(i, j int) bool {
		if takers[i].emptyIn != takers[j].emptyIn {
			return takers[i].emptyIn < takers[j].emptyIn
		}
		return takers[i].before(takers[j])
	})
	var moves []Move
	for _, t := range takers {
		for i := range donors {
			n := min(donors[i].units, t.units)
			floor := p.MinUnits
			if crumbs && donors[i].quiet {
				floor = 1
			}
			if n <= 0 || n < floor {
				continue
			}
			moves = append(moves, Move{From: donors[i].pool, To: t.pool, Units: n})
			donors[i].units -= n
			t.units -= n
		}
	}
	return moves
}

// side is one pool's surplus or deficit in a plan.
type side struct {
	pool    string
	units   Units
	quiet   bool          // a donor with no recent demand
	emptyIn time.Duration // a taker's projected time to empty
}

// before orders sides by units (most first), then by name.
func (s side) before(o side) bool {
	if s.units != o.units {
		return s.units > o.units
	}
	return s.pool < o.pool
}
