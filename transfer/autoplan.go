package transfer

import (
	"math"
	"sort"
	"time"
)

// The automatic rebalancer's rule, as pure functions of what it read: each pool's stock,
// its recent demand, the units already on their way to it and whether a stranded transfer
// froze it as a source. The coordinator reads, this file decides, the coordinator moves
// (through the same fenced transfers as any other: I1..I4 hold as for an operator's move).

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
