package transfer

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestAutoPlan(t *testing.T) {
	p := Policy{Window: 10 * time.Second, Horizon: 30 * time.Second, MinUnits: 5}
	for _, tc := range []struct {
		name  string
		pools []PoolDemand
		want  []Move
	}{
		{"all demand at one region: the quiet pools give it everything",
			[]PoolDemand{{Pool: "us", Available: 10, Recent: 40}, {Pool: "eu", Available: 35}, {Pool: "ap", Available: 25}},
			[]Move{{"eu", "us", 35}, {"ap", "us", 25}}},
		{"units on their way count at their destination",
			[]PoolDemand{{Pool: "us", Available: 10, Recent: 40, Incoming: 100}, {Pool: "eu", Available: 35}},
			[]Move{{"eu", "us", 10}}},
		{"a pool fed within the window gives nothing back yet",
			[]PoolDemand{{Pool: "us", Available: 0, Recent: 40}, {Pool: "eu", Available: 35, Fed: true}, {Pool: "ap", Available: 20}},
			[]Move{{"ap", "us", 20}}},
		{"a frozen pool gives nothing",
			[]PoolDemand{{Pool: "us", Available: 0, Recent: 40}, {Pool: "eu", Available: 35, Frozen: true}, {Pool: "ap", Available: 20}},
			[]Move{{"ap", "us", 20}}},
		{"the pool that runs out first is served first",
			[]PoolDemand{{Pool: "us", Available: 30, Recent: 40}, {Pool: "eu", Available: 1, Recent: 20}, {Pool: "ap", Available: 500}},
			[]Move{{"ap", "eu", 59}, {"ap", "us", 90}}},
		{"crumbs: near sell-out a quiet pool's last units go where buyers are, below the minimum",
			[]PoolDemand{{Pool: "us", Available: 1, Recent: 40}, {Pool: "eu", Available: 2}, {Pool: "ap", Available: 3, Recent: 1}},
			[]Move{{"eu", "us", 2}}},
		{"near sell-out: what is left is shared by demand, so every pool runs out together",
			[]PoolDemand{{Pool: "us", Available: 100, Recent: 700}, {Pool: "eu", Available: 600, Recent: 200}, {Pool: "ap", Available: 300, Recent: 100}},
			[]Move{{"eu", "us", 400}, {"ap", "us", 200}}},
		{"not near sell-out: no move below the minimum",
			[]PoolDemand{{Pool: "us", Available: 1, Recent: 1}, {Pool: "eu", Available: 200}},
			[]Move{}},
		{"the unallocated pool gives everything, receives nothing",
			[]PoolDemand{{Pool: Unallocated, Available: 50}, {Pool: "us", Available: 0, Recent: 10}},
			[]Move{{Unallocated, "us", 30}}},
		{"balanced: nothing moves",
			[]PoolDemand{{Pool: "us", Available: 300, Recent: 40}, {Pool: "eu", Available: 300, Recent: 40}},
			[]Move{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := p.AutoPlan(tc.pools)
			if len(got) != len(tc.want) {
				t.Fatalf("plan %v; want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("plan %v; want %v", got, tc.want)
				}
			}
		})
	}
}

func TestProject(t *testing.T) {
	p := Policy{Window: 10 * time.Second, Horizon: 30 * time.Second, MinUnits: 1}
	got := p.Project(PoolDemand{Pool: "us", Available: 15, Incoming: 5, Recent: 40})
	if got.PerSecond != 4 || got.EmptyIn != 5*time.Second {
		t.Fatalf("projection %+v; want 4/s, empty in 5s", got)
	}
	if got := p.Project(PoolDemand{Pool: "eu", Available: 15}); got.EmptyIn >= 0 || got.PerSecond != 0 {
		t.Fatalf("a quiet pool's projection %+v; want never empty", got)
	}
}

// AutoPlan conserves units, moves only available units of unfrozen pools, never into the
// unallocated pool, never takes a pool below its target (its need, or near sell-out its
// share by demand), and moves less than the minimum only out of a quiet pool near sell-out.
func TestAutoPlanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := Policy{Window: 10 * time.Second, Horizon: time.Duration(rapid.IntRange(1, 120).Draw(t, "h")) * time.Second,
			MinUnits: Units(rapid.Int64Range(1, 50).Draw(t, "min"))}
		var pools []PoolDemand
		for _, n := range []string{Unallocated, "us", "eu", "ap"} {
			d := PoolDemand{Pool: n, Available: Units(rapid.Int64Range(0, 500).Draw(t, "a"))}
			if n != Unallocated {
				d.Recent = Units(rapid.Int64Range(0, 300).Draw(t, "r"))
				d.Incoming = Units(rapid.Int64Range(0, 100).Draw(t, "in"))
				d.Frozen = rapid.Bool().Draw(t, "frozen")
				d.Fed = rapid.Bool().Draw(t, "fed")
			}
			pools = append(pools, d)
		}
		crumbs := p.NearSellOut(pools)
		after, by, targets := map[string]Units{}, map[string]PoolDemand{}, map[string]Units{}
		for i, d := range pools {
			after[d.Pool], by[d.Pool], targets[d.Pool] = d.Available, d, p.Targets(pools)[i]
		}
		for _, m := range p.AutoPlan(pools) {
			from := by[m.From]
			switch {
			case m.From == m.To || m.To == Unallocated || m.Units <= 0:
				t.Fatalf("bad move %v", m)
			case from.Frozen || from.Fed:
				t.Fatalf("move %v out of a frozen or fed pool", m)
			case m.Units < p.MinUnits && !(crumbs && from.Recent == 0):
				t.Fatalf("move %v below the minimum %d", m, p.MinUnits)
			}
			after[m.From] -= m.Units
			after[m.To] += m.Units
		}
		var before, total Units
		for _, d := range pools {
			before += d.Available
			total += after[d.Pool]
			if after[d.Pool] < 0 {
				t.Fatalf("%s gave more than it had: %d → %d", d.Pool, d.Available, after[d.Pool])
			}
			if d.Pool != Unallocated && after[d.Pool] < d.Available && after[d.Pool]+d.Incoming < targets[d.Pool] {
				t.Fatalf("%s taken below its target %d: %d → %d", d.Pool, targets[d.Pool], d.Available, after[d.Pool])
			}
			if !crumbs && d.Pool != Unallocated && targets[d.Pool] != p.Need(d) {
				t.Fatalf("%s's target %d is not its need %d though not near sell-out", d.Pool, targets[d.Pool], p.Need(d))
			}
		}
		if before != total {
			t.Fatalf("units not conserved: %d → %d", before, total)
		}
	})
}

// AutoRound reads the SKU's transfers into its pools: a requested transfer's units are gone
// from its source and on their way to its destination, a pending one's on their way, a
// stranded one freezes its source, a transfer posted from another region within the window
// marks its destination fed; only the unfinished ones count as in flight. The caller's pools
// are left as they were.
func TestAutoRoundCountsTransfers(t *testing.T) {
	p := Policy{Window: 3 * time.Second, Horizon: 10 * time.Second, MinUnits: 5}
	pools := []PoolDemand{{Pool: Unallocated}, {Pool: "us", Available: 50, Recent: 30},
		{Pool: "eu", Available: 40}, {Pool: "ap", Available: 30}, {Pool: "sa", Available: 20}}
	read := slices.Clone(pools)
	recent := []Transfer{
		{From: "eu", To: "us", Units: 10, State: Requested},
		{From: "ap", To: "us", Units: 5, State: Pending, Stranded: true},
		{From: "us", To: "sa", Units: 7, State: Posted},
		{From: Unallocated, To: "eu", Units: 40, State: Posted},
	}
	r := p.AutoRound(pools, recent)
	if !slices.Equal(pools, read) {
		t.Errorf("the caller's pools changed: %+v", pools)
	}
	got := map[string]PoolDemand{}
	for _, pp := range r.Pools {
		got[pp.Pool] = pp.PoolDemand
	}
	if r.InFlight != 2 {
		t.Errorf("in flight %d; want 2", r.InFlight)
	}
	if us := got["us"]; us.Incoming != 15 || us.Frozen || us.Fed {
		t.Errorf("us %+v; want 15 on their way", us)
	}
	if eu := got["eu"]; eu.Available != 30 || eu.Fed || eu.Frozen {
		t.Errorf("eu %+v; want 30 available (10 requested away), not fed by the allocation", eu)
	}
	if ap := got["ap"]; !ap.Frozen || ap.Available != 30 {
		t.Errorf("ap %+v; want frozen by its stranded transfer", ap)
	}
	if sa := got["sa"]; !sa.Fed {
		t.Errorf("sa %+v; want fed", sa)
	}
	if len(r.Moves) == 0 {
		t.Fatal("no moves; want eu's spare units to go to us")
	}
	for _, m := range r.Moves {
		if m.From == "ap" || m.From == "sa" {
			t.Errorf("move %v out of a frozen or fed pool", m)
		}
	}
}

// SinceOpening shortens the window to the time the sale has been open, never below
// MinRateWindow, and leaves it alone once the sale has been open longer.
func TestSinceOpening(t *testing.T) {
	p := Policy{Window: 5 * time.Second, Horizon: 10 * time.Second, MinUnits: 2}
	opens := time.Unix(1000, 0)
	for _, tc := range []struct {
		open, want time.Duration
	}{
		{0, MinRateWindow}, {300 * time.Millisecond, MinRateWindow}, {2 * time.Second, 2 * time.Second},
		{5 * time.Second, 5 * time.Second}, {time.Hour, 5 * time.Second},
	} {
		got := p.SinceOpening(opens, opens.Add(tc.open))
		if got.Window != tc.want || got.Horizon != p.Horizon || got.MinUnits != p.MinUnits {
			t.Errorf("open for %s: %+v; want window %s, the rest unchanged", tc.open, got, tc.want)
		}
	}
}
