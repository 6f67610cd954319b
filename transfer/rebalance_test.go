package transfer

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestPlanMovesTowardDemand(t *testing.T) {
	p := Policy{Window: time.Minute, Horizon: time.Minute, MinUnits: 10}
	moves := p.Plan([]PoolDemand{
		{Pool: "us", Available: 5, Recent: 500},   // needs 495 more
		{Pool: "eu", Available: 400, Recent: 100}, // 300 spare
		{Pool: "ap", Available: 50, Recent: 45},   // 5 spare: under the minimum
	})
	if len(moves) != 1 || moves[0] != (Move{From: "eu", To: "us", Units: 300}) {
		t.Fatalf("plan %v; want eu → us 300", moves)
	}
	if got := p.Plan([]PoolDemand{{Pool: "us", Available: 10, Recent: 5}, {Pool: "eu", Available: 10, Recent: 5}}); len(got) != 0 {
		t.Fatalf("balanced pools moved: %v", got)
	}
	moves = p.Plan([]PoolDemand{{Pool: Unallocated, Available: 100}, {Pool: "us", Available: 0, Recent: 60}})
	if len(moves) != 1 || moves[0] != (Move{From: Unallocated, To: "us", Units: 60}) {
		t.Fatalf("plan %v; want unallocated → us 60", moves)
	}
}

// The plan never takes a source below its own need, never moves less than the minimum,
// and conserves units.
func TestPlanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := Policy{Window: time.Minute, Horizon: time.Duration(rapid.IntRange(1, 120).Draw(t, "h")) * time.Second,
			MinUnits: Units(rapid.Int64Range(1, 50).Draw(t, "min"))}
		names := []string{Unallocated, "us", "eu", "ap"}
		var pools []PoolDemand
		for _, n := range names {
			pools = append(pools, PoolDemand{Pool: n, Available: Units(rapid.Int64Range(0, 1000).Draw(t, "a")),
				Recent: Units(rapid.Int64Range(0, 1000).Draw(t, "r"))})
		}
		after := map[string]Units{}
		for _, d := range pools {
			after[d.Pool] = d.Available
		}
		for _, m := range p.Plan(pools) {
			if m.Units < p.MinUnits || m.From == m.To {
				t.Fatalf("bad move %v", m)
			}
			after[m.From] -= m.Units
			after[m.To] += m.Units
		}
		var before, total Units
		for _, d := range pools {
			before += d.Available
			total += after[d.Pool]
			need := p.Need(d)
			if d.Pool == Unallocated {
				need = 0
			}
			if after[d.Pool] < d.Available && after[d.Pool] < need {
				t.Fatalf("%s taken below its need %d: %d → %d", d.Pool, need, d.Available, after[d.Pool])
			}
		}
		if before != total {
			t.Fatalf("units not conserved: %d → %d", before, total)
		}
	})
}
