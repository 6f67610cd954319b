// Package sim is quota's deterministic simulation: one seeded, single-threaded run of three
// regions (or, at the national shape, a dozen regions and 3,000 pools), two coordinators, a
// ledger, storefronts and an operator, on a simulated clock, over a message layer that
// drops, delays, duplicates and reorders, with crashes that lose a process's memory and
// keep its durable state.
//
// What runs is the product's own logic: each region is a region.Core (the writer's
// in-memory reserve, confirm, release and expiry ops, and the participant rules
// transfer.Admit and transfer.Decide* that the region's SQL operations apply); each
// coordinator runs the production transfer driver, coordinator.Drive, the state machine
// that Coordinator.Transfer, Allocate, Resolve and the background driveLoop run in
// production: its participant calls travel on the simulated network, its ledger writes go
// through coordinator.LedgerTx to a ledger with the SQL statements' semantics (fenced,
// guarded, all or nothing), its clock is the simulated one. Rebalances are planned by
// transfer.Policy.Plan, the automatic rebalancer's rounds by transfer.Policy.AutoRound (the
// coordinator's own rule); after every step the run is judged by coordinator.EvaluateSnapshot,
// the live auditor's rules (I1, I2, I3, I5), plus I4 and I6 checks of its own. What is
// simulated: SQL (a durable image per region, taken at each commit, and its epoch row, whose
// fence every batch meets by the writer's own rule, transfer.CurrentEpoch), gRPC (messages),
// etcd (the leaders, their generation and epochs; a deposed leader may run on unaware) and
// time.
//
// Same seed, same run: any failure names its seed, and `go test ./sim -run
// 'TestSimulation$' -seed N -v` replays it (`make sim SEED=N`).
package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/quotaworks/quota/transfer"
)

// Config sizes one simulated run.
type Config struct {
	Seed uint64
	// Steps is how many steps the faulty phase lasts; healing and the final audit follow.
	Steps int
	// Users is how many distinct buyers the storefronts draw from.
	Users int
	// Total is the units of each SKU.
	Total transfer.Units
	// Faults turns the nemesis and the lossy network on.
	Faults bool
	// Shape names the regions and SKUs simulated: ShapeDefault ("" too) or ShapeNational.
	Shape string
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Steps <= 0:
		return fmt.Errorf("steps: must be positive, got %d", c.Steps)
	case c.Users <= 0:
		return fmt.Errorf("users: must be positive, got %d", c.Users)
	case c.Total <= 0 || c.Total > transfer.MaxUnits:
		return fmt.Errorf("total: must be 1..%d, got %d", transfer.MaxUnits, c.Total)
	}
	s, err := shapeOf(c.Shape)
	if err != nil {
		return err
	}
	return s.validate()
}

// DefaultConfig is the run `make test` does for each seed.
func DefaultConfig(seed uint64) Config {
	return Config{Seed: seed, Steps: 1500, Users: 40, Total: 300, Faults: true}
}

// NationalConfig is one seed at the national shape: a dozen regions and 3,000 pools, each
// SKU's 60 units spread thin over them (2 to 9 a region) so that the wanted SKUs run out
// where they are wanted and transfers move them.
func NationalConfig(seed uint64) Config {
	return Config{Seed: seed, Steps: 1500, Users: 100, Total: 60, Faults: true, Shape: ShapeNational}
}

// ConfigOf is the run of one seed at the shape of that name.
func ConfigOf(shapeName string, seed uint64) (Config, error) {
	switch shapeName {
	case "", ShapeDefault:
		return DefaultConfig(seed), nil
	case ShapeNational:
		return NationalConfig(seed), nil
	}
	_, err := shapeOf(shapeName)
	return Config{}, err
}

// Stats is what one run did.
type Stats struct {
	Seed    uint64
	Steps   int
	SimTime time.Duration
	// Faults counts what the nemesis and the network did, by kind.
	Faults map[string]int
	// Ops counts what the storefronts, coordinators and operator did, by kind.
	Ops map[string]int
}

// Failure is an invariant the run broke, with the seed that reproduces it.
type Failure struct {
	Seed      uint64
	Step      int
	At        time.Duration
	Invariant string
	Detail    string
	Shape     string // the Config's shape, to replay it with
}

// Error reports the failure and how to replay it.
func (f *Failure) Error() string {
	shape := ""
	if f.Shape != "" && f.Shape != ShapeDefault {
		shape = " -shape " + f.Shape
	}
	return fmt.Sprintf("seed %d, step %d (simulated %s): %s: %s\nreplay: go test ./sim -run 'TestSimulation$' -seed %d%s -v",
		f.Seed, f.Step, f.At, f.Invariant, f.Detail, f.Seed, shape)
}

const (
	sale        = "sim"
	holdTTL     = 2 * time.Second
	callTimeout = 250 * time.Millisecond
	retryEvery  = 300 * time.Millisecond
	strandAfter = 5 * time.Second
	sweepEvery  = 500 * time.Millisecond
	healSteps   = 4000
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// world is one run's whole state. Only Run's goroutine touches it.
type world struct {
	cfg     Config
	shape   shape
	pools   []string // where the operator moves stock: the unallocated pool and the regions
	procs   []string // the processes whose links the nemesis cuts
	rng     *rand.Rand
	now     time.Time
	step    int
	faults  bool
	net     network
	regions map[string]*regionNode
	coords  []*coordNode
	leader  int   // the coordinator etcd says leads
	gen     int64 // its generation
	ledger  *ledger
	store   *storefront
	stats   Stats
	seq     int
	checked int             // the ledger version the last check saw
	full    int             // the step of the last check of every SKU
	touched map[string]bool // SKUs whose durable state changed since the last check
	scratch checkScratch
	fail    *Failure
}

// Run simulates one seed and returns what it did, or the first invariant it broke.
func Run(cfg Config) (Stats, error) {
	if err := cfg.Validate(); err != nil {
		return Stats{}, err
	}
	w := newWorld(cfg)
	w.run()
	w.stats.Steps, w.stats.SimTime = w.step, w.now.Sub(epoch)
	if w.fail != nil {
		return w.stats, w.fail
	}
	return w.stats, nil
}

// run is the faulty phase, then healing. A panic of the product's code (an assertion of an
// invariant, such as a transition the table does not allow) is the run's failure, with its
// seed and step.
func (w *world) run() {
	defer func() {
		if p := recover(); p != nil {
			w.failf("panic", "%v", p)
		}
	}()
	w.setup()
	for w.step = 1; w.step <= w.cfg.Steps && w.fail == nil; w.step++ {
		w.tick(true)
	}
	if w.fail == nil {
		w.heal()
	}
}

// newWorld builds the world of a valid cfg (Run validates it first).
func newWorld(cfg Config) *world {
	sh, err := shapeOf(cfg.Shape)
	if err != nil {
		panic(fmt.Sprintf("sim: %v", err))
	}
	w := &world{cfg: cfg, shape: sh, rng: rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)), now: epoch, faults: cfg.Faults,
		regions: map[string]*regionNode{}, ledger: newLedger(), store: newStorefront(), touched: map[string]bool{},
		pools:   append([]string{transfer.Unallocated}, sh.regions...),
		procs:   append([]string{"c1", "c2"}, sh.regions...),
		scratch: checkScratch{used: map[userSKU][2]transfer.Units{}, perKey: map[dupKey]string{}, carts: map[string]cartSeen{}},
		stats:   Stats{Seed: cfg.Seed, Faults: map[string]int{}, Ops: map[string]int{}}}
	for _, r := range sh.regions {
		w.regions[r] = newRegionNode(r)
	}
	w.coords = []*coordNode{newCoordNode("c1"), newCoordNode("c2")}
	w.gen = 1
	w.coords[0].lead(1)
	return w
}

// tick is one step: time moves on, due messages arrive, every process takes its turn, the
// storefronts and (in the faulty phase) the nemesis and operator act, then every invariant
// is checked.
func (w *world) tick(traffic bool) {
	w.now = w.now.Add(time.Duration(1+w.rng.IntN(20)) * time.Millisecond)
	w.net.deliverDue(w)
	for _, name := range w.shape.regions {
		w.regions[name].turn(w)
	}
	for _, c := range w.coords {
		c.turn(w)
	}
	if traffic {
		w.store.act(w)
	}
	if w.faults {
		w.nemesis()
	}
	if traffic {
		w.operator()
	}
	w.check(false)
}

func (w *world) nextID() int {
	w.seq++
	return w.seq
}

// failf records the first broken invariant; the run stops after this step.
func (w *world) failf(inv, format string, args ...any) {
	if w.fail != nil {
		return
	}
	w.fail = &Failure{Seed: w.cfg.Seed, Step: w.step, At: w.now.Sub(epoch), Invariant: inv, Detail: fmt.Sprintf(format, args...),
		Shape: w.cfg.Shape}
}

// chance is true with probability p.
func (w *world) chance(p float64) bool { return w.rng.Float64() < p }

func (w *world) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

func pick[T any](w *world, xs []T) T { return xs[w.rng.IntN(len(xs))] }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
