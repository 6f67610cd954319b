package sim

import (
	"flag"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
)

var (
	flagSeed  = flag.Uint64("seed", 0, "replay this one seed (0: run -seeds seeds from -first)")
	flagSeeds = flag.Int("seeds", 1000, "how many seeds to run")
	flagFirst = flag.Uint64("first", 1, "the first seed of the range")
	flagSteps = flag.Int("steps", 0, "steps of the faulty phase per seed (0: the default)")
	flagStop  = flag.Bool("stop", false, "start no seed after the first failure (planted-bug runs: the first failing seed is the smallest)")
	flagShape = flag.String("shape", ShapeDefault, "the regions and SKUs simulated: default (3 regions, 2 SKUs) or national (12 regions, 250 SKUs: 3,000 pools)")
)

// raceSeeds is how many seeds TestSimulation runs under -race when -seeds is not given:
// `make test` runs the full 1,000 in its sim step, without -race (race_test.go).
const raceSeeds = 100

// TestSimulation runs the deterministic simulation over a range of seeds (1,000 in `make
// test`'s sim step; `make sim SEEDS=100000` for more) and prints the figures; any failing
// seed is named with the command that replays it.
func TestSimulation(t *testing.T) {
	sh, err := shapeOf(*flagShape)
	if err != nil {
		t.Fatal(err)
	}
	n := *flagSeeds
	if raceEnabled && *flagSeed == 0 && !flagSet("seeds") {
		n = raceSeeds
		t.Logf("built with -race: %d seeds (make test's sim step runs %d without it)", n, *flagSeeds)
	}
	seeds := make([]uint64, 0, n)
	if *flagSeed != 0 {
		seeds = append(seeds, *flagSeed)
	} else {
		for i := 0; i < n; i++ {
			seeds = append(seeds, *flagFirst+uint64(i))
		}
	}
	// Each run's heap is small and short-lived: collecting it at 4x instead of 2x its live
	// size spends a fifth less CPU on the collector, for some tens of megabytes.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	start := time.Now()
	total, ran, failures := runSeeds(sh.name, seeds)
	for _, f := range failures {
		t.Error(f)
	}
	line := shapeLine(sh) + fmt.Sprintf("SIM: %d seeds (%d..%d), %d failed, %d steps, simulated %s, wall %s\n  faults: %s\n  ops: %s",
		ran, seeds[0], seeds[0]+uint64(ran)-1, len(failures), total.Steps, total.SimTime.Round(time.Second),
		time.Since(start).Round(time.Millisecond), counts(total.Faults), counts(total.Ops))
	t.Log(line)
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// shapeLine names a shape other than the default above the figures ("" for the default,
// whose figures read as they always have).
func shapeLine(sh shape) string {
	if sh.name == ShapeDefault {
		return ""
	}
	return "shape " + sh.describe() + "\n"
}

// runSeeds runs the seeds at shape shapeName on every core (each run is single-threaded and
// independent) and sums their figures; it returns how many seeds ran (all but those -stop
// skipped).
func runSeeds(shapeName string, seeds []uint64) (Stats, int, []error) {
	var (
		mu       sync.Mutex
		total    = Stats{Faults: map[string]int{}, Ops: map[string]int{}}
		failures []error
		wg       sync.WaitGroup
		next     = make(chan uint64)
		ran      int
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seed := range next {
				cfg, err := ConfigOf(shapeName, seed)
				if err != nil {
					panic(err) // the shape was checked before any seed ran
				}
				if *flagSteps > 0 {
					cfg.Steps = *flagSteps
				}
				st, err := Run(cfg)
				mu.Lock()
				total.Steps += st.Steps
				total.SimTime += st.SimTime
				for k, v := range st.Faults {
					total.Faults[k] += v
				}
				for k, v := range st.Ops {
					total.Ops[k] += v
				}
				if err != nil {
					failures = append(failures, err)
				}
				mu.Unlock()
			}
		}()
	}
	for _, s := range seeds {
		mu.Lock()
		stop := *flagStop && len(failures) > 0
		mu.Unlock()
		if stop {
			break
		}
		next <- s
		ran++
	}
	close(next)
	wg.Wait()
	slices.SortFunc(failures, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return total, ran, failures
}

func counts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// TestSimulationIsDeterministic runs one seed twice at each shape (the national one for 100
// steps of faults): the same seed must give the same run.
func TestSimulationIsDeterministic(t *testing.T) {
	national := NationalConfig(42)
	national.Steps = 100
	for _, cfg := range []Config{DefaultConfig(42), national} {
		a, errA := Run(cfg)
		b, errB := Run(cfg)
		if fmt.Sprint(a) != fmt.Sprint(b) || fmt.Sprint(errA) != fmt.Sprint(errB) {
			t.Fatalf("seed 42 (%s) ran twice differently:\n%+v %v\n%+v %v", cfg.Shape, a, errA, b, errB)
		}
		if a.Ops["reserve"] == 0 || a.Ops["transfer"] == 0 || len(a.Faults) == 0 {
			t.Fatalf("seed 42 (%s) did too little to prove anything: %+v", cfg.Shape, a)
		}
	}
}

// TestSimulationCatchesBrokenState makes sure the checks can fail: a unit appearing from
// nowhere in the ledger is reported as an I1 breach.
func TestSimulationCatchesBrokenState(t *testing.T) {
	w := healthyWorld(t, DefaultConfig(7), 300)
	w.ledger.unallocated["phone"]++ // a unit from nowhere: I1
	w.ledger.version++              // as a ledger write does
	w.check(false)
	if f := w.fail; f == nil || f.Invariant != "audit" || !strings.Contains(f.Detail, "I1") {
		t.Fatalf("a unit from nowhere was not reported as an I1 breach: %v", f)
	}
}

// nationalSeeds are the national seeds the suite runs (`make sim SHAPE=national` runs more);
// under -race only the first.
var nationalSeeds = []uint64{1, 2}

// TestSimulationNational runs a few seeds at the national shape, a dozen regions and 3,000
// pools: the invariants must hold there too, with every fault picking among all of them.
func TestSimulationNational(t *testing.T) {
	seeds := nationalSeeds
	if raceEnabled {
		seeds = seeds[:1]
	}
	total, ran, failures := runSeeds(ShapeNational, seeds)
	for _, f := range failures {
		t.Error(f)
	}
	line := fmt.Sprintf("SIM national: %d seeds, %d failed, %d steps, simulated %s\n  faults: %s\n  ops: %s",
		ran, len(failures), total.Steps, total.SimTime.Round(time.Second), counts(total.Faults), counts(total.Ops))
	t.Log(line)
	// Every seed allocates every SKU to every region, and the faults and the storefronts act.
	if allocations := ran * nationalRegions * nationalSKUs; total.Ops["transfer"] < allocations ||
		total.Ops["reserve"] == 0 || total.Faults["region crash"] == 0 || total.Ops["coordinator write fenced"] == 0 {
		t.Fatalf("the national seeds did too little to prove anything (want at least %d transfers): %+v", allocations, total)
	}
}

// TestSimulationNationalCatchesBrokenState makes sure the checks between two whole ones
// judge what a step changed: at the national shape, a unit from nowhere in the ledger or at
// a region is reported as an I1 breach by the next check, not only by the next whole one.
func TestSimulationNationalCatchesBrokenState(t *testing.T) {
	for _, where := range []string{"ledger", "region"} {
		t.Run(where, func(t *testing.T) {
			w := healthyWorld(t, NationalConfig(7), 20)
			w.full = w.step // the next check judges only what changed
			sku := w.shape.skus[len(w.shape.skus)-1]
			switch where {
			case "ledger":
				w.ledger.addUnallocated(sku, 1) // as a ledger write does
				w.ledger.version++
			case "region": // a credit of a transfer the ledger never made
				r := w.regions[w.shape.regions[len(w.shape.regions)-1]]
				_, err := r.durable.Credit(region.CreditRequest{Generation: w.gen, TransferID: "from-nowhere", Sale: sale, SKU: sku, Units: 1})
				if err != nil {
					t.Fatalf("credit from nowhere: %v", err)
				}
				r.dirty = true // as a commit does
			}
			w.check(false)
			if f := w.fail; f == nil || f.Invariant != "audit" || !strings.Contains(f.Detail, "I1 "+sale+"/"+sku) {
				t.Fatalf("a unit from nowhere in %s's %s was not reported as an I1 breach: %v", where, sku, f)
			}
		})
	}
}

// healthyWorld sets up cfg's world and runs it steps steps, failing the test if it breaks
// before the test has broken anything.
func healthyWorld(t *testing.T, cfg Config, steps int) *world {
	t.Helper()
	w := newWorld(cfg)
	w.setup()
	for w.step = 1; w.step <= steps && w.fail == nil; w.step++ {
		w.tick(true)
	}
	if w.fail != nil {
		t.Fatalf("seed %d failed before the test broke anything: %v", cfg.Seed, w.fail)
	}
	return w
}
