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

// AutoPlan is the automatic rebalancer's plan: Plan's matching of surpluses to deficits,
// with the deficits served in the order the pools would run out (soonest first), frozen
// pools giving nothing, units already on their way counted at their destination, and, near
// sell-out, the pools whose buyers went quiet giving all they have to the pools whose buyers
// are still arriving, below MinUnits too. Only available units move, never held ones (I2:
// a hold keeps its unit). Deterministic for the same input.
func (p Policy) AutoPlan(pools []PoolDemand) []Move {
	crumbs := p.NearSellOut(pools)
	var donors, takers []side
	for _, d := range pools {
		if s, ok := p.surplus(d); ok {
			donors = append(donors, side{pool: d.Pool, units: s, quiet: d.Recent == 0})
		}
		if need, have := p.Need(d), d.Available+d.Incoming; d.Pool != Unallocated && need > have {
			takers = append(takers, side{pool: d.Pool, units: need - have, emptyIn: p.Project(d).EmptyIn})
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

// surplus is what d can give: its available units above its own need (counting what is on
// its way to it), all of the unallocated pool's, nothing of a frozen pool's.
func (p Policy) surplus(d PoolDemand) (Units, bool) {
	if d.Frozen || d.Available <= 0 {
		return 0, false
	}
	if d.Pool == Unallocated {
		return d.Available, true
	}
	spare := d.Available + d.Incoming - p.Need(d)
	return min(spare, d.Available), spare > 0
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
