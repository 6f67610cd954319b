package transfer

import (
	"sort"
	"time"
)

// PoolDemand is one pool's stock and recent demand, the input of a rebalance plan.
type PoolDemand struct {
	Pool      string
	Available Units
	// Recent is the units reserved in the pool during the policy's window.
	Recent Units
	// Incoming is the units of unfinished transfers on their way to the pool (AutoPlan
	// counts them as the pool's own; Plan ignores them).
	Incoming Units
	// Frozen is set when a stranded transfer left the pool: AutoPlan takes nothing from it
	// until the transfer is resolved (Plan ignores it).
	Frozen bool
	// Fed is set when the pool received units from another region within the window:
	// AutoPlan takes nothing from it yet, so a noisy rate does not send units back and forth
	// (Plan ignores it).
	Fed bool
}

// Policy is the rebalancer's rule: expect each region to keep selling at its recent rate
// for Horizon; move stock from pools with more than that to pools with less, in transfers
// of at least MinUnits, never taking a source below what it needs itself.
type Policy struct {
	Window   time.Duration
	Horizon  time.Duration
	MinUnits Units
}

// Move is one planned transfer.
type Move struct {
	From, To string
	Units    Units
}

// Need is the units a pool expects to sell within the horizon at its recent rate.
func (p Policy) Need(d PoolDemand) Units {
	if p.Window <= 0 {
		return 0
	}
	return Units(int64(d.Recent) * int64(p.Horizon) / int64(p.Window))
}

// Plan matches surpluses to deficits, largest first. The unallocated pool (named
// Unallocated) has no demand of its own, so all of it is surplus. The plan is deterministic
// for the same input.
func (p Policy) Plan(pools []PoolDemand) []Move {
	var donors, takers []side
	for _, d := range pools {
		need := p.Need(d)
		if d.Pool == Unallocated {
			need = 0
		}
		switch {
		case d.Available > need:
			donors = append(donors, side{pool: d.Pool, units: d.Available - need})
		case need > d.Available:
			takers = append(takers, side{pool: d.Pool, units: need - d.Available})
		}
	}
	sort.SliceStable(donors, func(i, j int) bool { return donors[i].before(donors[j]) })
	sort.SliceStable(takers, func(i, j int) bool { return takers[i].before(takers[j]) })
	var moves []Move
	for _, t := range takers {
		for i := range donors {
			if t.units < p.MinUnits || t.units <= 0 {
				break
			}
			n := min(donors[i].units, t.units)
			if n < p.MinUnits || n <= 0 {
				continue
			}
			moves = append(moves, Move{From: donors[i].pool, To: t.pool, Units: n})
			donors[i].units -= n
			t.units -= n
		}
	}
	return moves
}
