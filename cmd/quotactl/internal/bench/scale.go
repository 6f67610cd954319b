package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/quotaworks/quota/internal/pgutil"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The growth curves of `quotactl bench scale`, in the order they run.
const (
	CurvePools       = "pools"       // a region's reservations/s and p99 against the pools it holds
	CurveCoordinator = "coordinator" // the coordinator's idle queries per region database against the sales
	CurveTakeover    = "takeover"    // a region takeover, cold and warm, against the archived closed holds
	CurveAudit       = "audit"       // the audit's time against the transfers and holds of a sale
)

// ScaleCurves are every curve, in the order they run.
var ScaleCurves = []string{CurvePools, CurveCoordinator, CurveTakeover, CurveAudit}

// The coordinator curve's two modes: which of the coordinator's loops read the regions.
const (
	ModeSoldOutLoop = "sold-out loop"              // sales in manual mode, the rebalancer off
	ModeBothLoops   = "sold-out loop + rebalancer" // sales in auto mode, the rebalancer on
)

// scaleRegions are the regions of the coordinator and audit curves' clusters.
var scaleRegions = []string{"us", "eu", "ap"}

// skusPerSale is how many SKUs the pools curve gives each sale: pools = sales × SKUs.
const skusPerSale = 10

// ScaleConfig is one run of `quotactl bench scale`. Every list is a curve's points, run in
// increasing order, each point measured.
type ScaleConfig struct {
	PGURL, DBPrefix string
	Curves          []string
	// Pools are the pools live in the region at each point of the pools curve; PoolOps the
	// reservations each point makes, spread round-robin over them, from Concurrency callers.
	Pools       []int
	PoolOps     int64
	Concurrency int
	// Sales are the idle sales live at each point of the coordinator curve (a point with
	// none comes first), each of IdleSKUs SKUs (default 10); each point is watched for
	// IdleWindow, with the coordinator's continuous audit every AuditInterval (0: none).
	Sales         []int
	IdleSKUs      int
	IdleWindow    time.Duration
	AuditInterval time.Duration
	// ClosedHolds are the archived closed holds stored at each takeover point (holds_closed);
	// TakeoverLive the held holds stored before the first point; TakeoverRuns the cold
	// takeovers timed at each point (the median is reported); LiveOps the reservations the
	// old leader makes before the warm standby takes over.
	ClosedHolds  []int64
	TakeoverLive int64
	TakeoverRuns int
	LiveOps      int
	// Transfers and AuditHolds are the audit curve's points: the sale's transfers, then the
	// holds stored over its three regions (with every transfer made).
	Transfers  []int
	AuditHolds []int64
	// AuditRuns is how many times each audit point is timed (the median is reported);
	// TransfersInFlight how many of the audit curve's transfers are asked for at once
	// (default 64); TransfersViaCoordinator how many are made through the coordinator, the
	// rest being stored as copies of those (default 1,000).
	AuditRuns               int
	TransfersInFlight       int
	TransfersViaCoordinator int
	// Duration caps each reservation load; CurveTimeout each curve.
	Duration     time.Duration
	CurveTimeout time.Duration
	// GC is the Go collector's setting for the whole process, as quotad's (default
	// gcconf.Default).
	GC       gcconf.Config
	Progress func(string)
	Logger   *slog.Logger
}

// Validate checks the configuration, naming a bad setting by its flag, and fills in defaults.
func (c *ScaleConfig) Validate() error {
	if c.DBPrefix == "" {
		c.DBPrefix = fmt.Sprintf("quota_bench_sc_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	if c.GC == (gcconf.Config{}) {
		c.GC = gcconf.Default()
	}
	if c.AuditRuns == 0 {
		c.AuditRuns = 3
	}
	if c.TakeoverRuns == 0 {
		c.TakeoverRuns = 1
	}
	if c.TransfersInFlight == 0 {
		c.TransfersInFlight = 64
	}
	if c.TransfersViaCoordinator == 0 {
		c.TransfersViaCoordinator = 1000
	}
	if c.IdleSKUs == 0 {
		c.IdleSKUs = skusPerSale
	}
	for _, k := range c.Curves {
		if !slices.Contains(ScaleCurves, k) {
			return fmt.Errorf("--curves: %q is not one of %v", k, ScaleCurves)
		}
	}
	switch {
	case c.PGURL == "":
		return errors.New("--pg-url: must be set")
	case !prefixPattern.MatchString(c.DBPrefix):
		return fmt.Errorf("--db-prefix %q: lower-case letters, digits and _, at most 40", c.DBPrefix)
	case len(c.Curves) == 0:
		return errors.New("--curves: name at least one")
	case c.PoolOps < 1 || c.PoolOps > 10_000_000 || c.Concurrency < 1 || c.Concurrency > 10_000:
		return fmt.Errorf("--pool-ops %d, --concurrency %d: must be 1..10000000 and 1..10000", c.PoolOps, c.Concurrency)
	case c.IdleWindow < time.Second || c.IdleWindow > 5*time.Minute:
		return fmt.Errorf("--idle-window %s: must be 1s..5m", c.IdleWindow)
	case c.IdleSKUs < 1 || c.IdleSKUs > 100:
		return fmt.Errorf("--idle-skus %d: must be 1..100", c.IdleSKUs)
	case c.AuditInterval < 0 || c.AuditInterval > time.Hour:
		return fmt.Errorf("--audit-interval %s: must be 0 (none) ..1h", c.AuditInterval)
	case c.TransfersInFlight < 1 || c.TransfersInFlight > 256:
		return fmt.Errorf("--transfers-in-flight %d: must be 1..256", c.TransfersInFlight)
	case c.TransfersViaCoordinator < 6 || c.TransfersViaCoordinator > 1_000_000:
		return fmt.Errorf("--transfers-via-coordinator %d: must be 6..1000000", c.TransfersViaCoordinator)
	case c.LiveOps < 1 || c.LiveOps > 1_000_000 || c.AuditRuns < 1 || c.AuditRuns > 20:
		return fmt.Errorf("--live-ops %d, --audit-runs %d: must be 1..1000000 and 1..20", c.LiveOps, c.AuditRuns)
	case c.TakeoverLive < 0 || c.TakeoverLive > 20_000_000 || c.TakeoverRuns < 1 || c.TakeoverRuns > 20:
		return fmt.Errorf("--takeover-live %d, --takeover-runs %d: must be 0..20000000 and 1..20", c.TakeoverLive, c.TakeoverRuns)
	case c.GC.Validate() != nil:
		return fmt.Errorf("--gc-percent, --memory-limit: %w", c.GC.Validate())
	case c.Duration <= 0 || c.CurveTimeout <= 0:
		return fmt.Errorf("--duration %s, --curve-timeout %s: must be positive", c.Duration, c.CurveTimeout)
	}
	return c.checkPoints()
}

// checkPoints checks every curve's points: at most 8 each, increasing, within bounds.
func (c *ScaleConfig) checkPoints() error {
	ints := func(flag string, xs []int, lo, hi int) error {
		if len(xs) == 0 || len(xs) > 8 || !slices.IsSorted(xs) || xs[0] < lo || xs[len(xs)-1] > hi {
			return fmt.Errorf("--%s %v: want 1..8 points in increasing order, each %d..%d", flag, xs, lo, hi)
		}
		return nil
	}
	int64s := func(flag string, xs []int64, lo, hi int64) error {
		if len(xs) == 0 || len(xs) > 8 || !slices.IsSorted(xs) || xs[0] < lo || xs[len(xs)-1] > hi {
			return fmt.Errorf("--%s %v: want 1..8 points in increasing order, each %d..%d", flag, xs, lo, hi)
		}
		return nil
	}
	return errors.Join(ints("pools", c.Pools, 1, 10_000), ints("sales", c.Sales, 1, 1_000),
		int64s("closed-holds", c.ClosedHolds, 0, 20_000_000), ints("transfers", c.Transfers, 1, 100_000),
		int64s("audit-holds", c.AuditHolds, 0, 20_000_000))
}

func (c *ScaleConfig) progress(format string, args ...any) {
	if c.Progress != nil {
		c.Progress(fmt.Sprintf(format, args...))
	}
}

// ScaleSetup is the machine a run measured on and how loaded it was.
type ScaleSetup struct {
	CPUs         int    `json:"cpus"`
	GOMAXPROCS   int    `json:"gomaxprocs"`
	GoVersion    string `json:"go_version"`
	GC           string `json:"go_gc"`
	Postgres     string `json:"postgres"`
	Placement    string `json:"placement"`
	LoadAvgStart string `json:"load_avg_start"`
	LoadAvgEnd   string `json:"load_avg_end"`
}

// ScaleReport is a whole run: each curve's points, in order.
type ScaleReport struct {
	Setup       ScaleSetup      `json:"setup"`
	Pools       []PoolsPoint    `json:"pools,omitempty"`
	Coordinator []IdlePoint     `json:"coordinator,omitempty"`
	Takeover    []TakeoverPoint `json:"takeover,omitempty"`
	Audit       []AuditPoint    `json:"audit,omitempty"`
}

// RunScale runs the configured curves one after another, each on a cluster or database of
// its own, and reports every point. Every database a curve creates is dropped when the curve
// ends, also on error.
func RunScale(ctx context.Context, cfg ScaleConfig) (rep *ScaleReport, err error) {
	defer gcconf.Apply(gcconf.Apply(cfg.GC))
	rep = &ScaleReport{Setup: ScaleSetup{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), LoadAvgStart: loadAvg(),
		GoVersion: runtime.Version(), GC: cfg.GC.String(),
		Placement: "load generator, regions, coordinator and etcd in this one process; PostgreSQL on the same machine"}}
	if rep.Setup.Postgres, err = serverVersion(ctx, cfg.PGURL); err != nil {
		return nil, err
	}
	runs := map[string]func(context.Context, *databases) error{
		CurvePools: func(ctx context.Context, dbs *databases) (err error) {
			rep.Pools, err = runPoolsCurve(ctx, &cfg, dbs)
			return err
		},
		CurveCoordinator: func(ctx context.Context, dbs *databases) (err error) {
			rep.Coordinator, err = runIdleCurve(ctx, &cfg, dbs)
			return err
		},
		CurveTakeover: func(ctx context.Context, dbs *databases) (err error) {
			rep.Takeover, err = runTakeoverCurve(ctx, &cfg, dbs)
			return err
		},
		CurveAudit: func(ctx context.Context, dbs *databases) (err error) {
			rep.Audit, err = runAuditCurve(ctx, &cfg, dbs)
			return err
		},
	}
	for _, k := range ScaleCurves {
		if !slices.Contains(cfg.Curves, k) {
			continue
		}
		dbs := &databases{admin: cfg.PGURL}
		cctx, cancel := context.WithTimeout(ctx, cfg.CurveTimeout)
		err := runs[k](cctx, dbs)
		cancel()
		err = errors.Join(err, dbs.dropAll())
		if err != nil {
			return rep, fmt.Errorf("%s curve: %w", k, err)
		}
	}
	rep.Setup.LoadAvgEnd = loadAvg()
	return rep, nil
}

// serverVersion is PostgreSQL's version string.
func serverVersion(ctx context.Context, url string) (string, error) {
	db, err := pgutil.Open(ctx, url, 1)
	if err != nil {
		return "", fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer db.Close()
	var v string
	if err := db.QueryRow(ctx, `SHOW server_version`).Scan(&v); err != nil {
		return "", fmt.Errorf("read the server version: %w", err)
	}
	return v, nil
}

// scaleRig is one curve's in-process cluster and a client of its coordinator.
type scaleRig struct {
	dev   *cluster.Dev
	dir   string
	conn  *grpc.ClientConn
	coord quotav1.CoordinatorServiceClient
}

// startScaleRig starts an insecure in-process cluster of regions on databases named
// <prefix>_<tag>_…, with the automatic rebalancer on or off and no continuous audit.
func startScaleRig(ctx context.Context, cfg *ScaleConfig, dbs *databases, tag string, regions []string, auto bool, audit time.Duration) (g *scaleRig, err error) {
	g = &scaleRig{}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if g.dir, err = os.MkdirTemp("", "quota-bench-scale-"); err != nil {
		return nil, err
	}
	prefix := cfg.DBPrefix + "_" + tag
	for _, role := range append([]string{"coordinator"}, regions...) {
		name := cluster.DBName(prefix, role)
		dbs.track(name)
		if err := pgutil.DropDatabase(ctx, cfg.PGURL, name); err != nil { // a leftover of an interrupted run
			return nil, err
		}
	}
	g.dev, err = cluster.StartDev(ctx, cluster.DevConfig{Regions: regions, PGURL: cfg.PGURL, DBPrefix: prefix, DataDir: g.dir,
		Host: "127.0.0.1", LeaseTTL: 10 * time.Second, Logger: cfg.Logger, Insecure: true, Auto: coordinator.AutoRebalance{Enabled: auto}, AuditInterval: audit})
	if err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	if g.conn, err = grpc.NewClient(g.dev.Coordinator.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	g.coord = quotav1.NewCoordinatorServiceClient(g.conn)
	return g, nil
}

func (g *scaleRig) close() {
	if g.conn != nil {
		g.conn.Close()
	}
	if g.dev != nil {
		g.dev.Close()
	}
	if g.dir != "" {
		os.RemoveAll(g.dir)
	}
}

// createSale creates sale with skus of units each, in the given rebalance mode, and
// allocates it over the regions by weights (one per region, in the cluster's order).
func (g *scaleRig) createSale(ctx context.Context, sale string, skus []string, units int64, mode coordinator.RebalanceMode, weights []int64) error {
	var totals []*quotav1.SkuTotal
	for _, k := range skus {
		totals = append(totals, &quotav1.SkuTotal{Sku: k, Total: units})
	}
	if _, err := g.coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, PerUserLimit: 1, HoldTtlMs: time.Hour.Milliseconds(),
		Skus: totals, Rebalance: string(mode)}); err != nil {
		return fmt.Errorf("create sale %s: %w", sale, err)
	}
	var ws []*quotav1.RegionWeight
	for i, r := range g.dev.Regions {
		if weights[i] > 0 {
			ws = append(ws, &quotav1.RegionWeight{Region: r.R.Name(), Weight: weights[i]})
		}
	}
	if _, err := g.coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale, Weights: ws}); err != nil {
		return fmt.Errorf("allocate sale %s: %w", sale, err)
	}
	return nil
}

// inParallel runs f(0..n-1) from at most width goroutines and returns the first error.
func inParallel(ctx context.Context, n, width int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, width) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
				}
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// The pools curve's two loads at each point.
const (
	LoadHot    = "hot"    // every reservation on one pool, the others idle
	LoadSpread = "spread" // reservations round-robin over every pool
)

// PoolsPoint is one load at one point of the pools curve: Pools pools live in one region,
// the reservations all on one of them (LoadHot) or spread round-robin over all (LoadSpread).
type PoolsPoint struct {
	Pools int    `json:"pools"`
	Sales int    `json:"sales"`
	Load  string `json:"load"`
	// The load, as bench's variant results: rate and latency over the measured window.
	Concurrency        int     `json:"concurrency"`
	Reservations       int64   `json:"reservations"`
	Errors             int64   `json:"errors"`
	FirstError         string  `json:"first_error,omitempty"`
	EndedBy            string  `json:"ended_by"`
	MeasuredSec        float64 `json:"measured_seconds"`
	ReservationsPerSec float64 `json:"reservations_per_sec"`
	P50Ms              float64 `json:"p50_ms"`
	P99Ms              float64 `json:"p99_ms"`
	ProcessCPUPerOp    float64 `json:"process_cpu_us_per_op"`
	MachineBusyPct     float64 `json:"machine_busy_pct"`
	MachineCPUPerOp    float64 `json:"machine_cpu_us_per_op"`
	// HoldRows is the holds the region's database has afterwards (the point's loads so far).
	HoldRows int64 `json:"hold_rows"`
}

// poolRef is one pool: a sale's SKU.
type poolRef struct{ sale, sku string }

// runPoolsCurve runs the same reservation loads over 1, 10, … pools. Each point has a fresh
// cluster of one region (so no point inherits the live holds, and the leader's heap, of the
// one before) on which it creates sales (up to skusPerSale SKUs each, all their stock in the
// region, manual mode) until the region holds that many pools.
func runPoolsCurve(ctx context.Context, cfg *ScaleConfig, dbs *databases) ([]PoolsPoint, error) {
	var out []PoolsPoint
	for i, n := range cfg.Pools {
		pts, err := runPoolsPoint(ctx, cfg, dbs, "pl"+strconv.Itoa(i), n)
		out = append(out, pts...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// poolsSettle is the most a pools point waits between creating its pools and its loads.
const poolsSettle = 15 * time.Second

// runPoolsPoint starts a cluster of one region, creates n pools in it and runs the hot load,
// then the spread one.
func runPoolsPoint(ctx context.Context, cfg *ScaleConfig, dbs *databases, tag string, n int) ([]PoolsPoint, error) {
	cfg.progress("pools: starting a cluster of one region (%s)", benchRegion)
	g, err := startScaleRig(ctx, cfg, dbs, tag, []string{benchRegion}, false, 0)
	if err != nil {
		return nil, err
	}
	defer g.close()
	conn, err := grpc.NewClient(g.dev.Regions[0].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rs := quotav1.NewRegionServiceClient(conn)
	// Every pool gets enough units for both loads, so none runs dry.
	made := time.Now()
	pools, sales, err := g.addPools(ctx, nil, n, 2*cfg.PoolOps+int64(cfg.Concurrency))
	if err != nil {
		return nil, err
	}
	// The other sales are to be idle: let the tail of their creation (the coordinator reads a
	// new sale's stock for a few seconds) pass first, as long as creating them took, at most
	// poolsSettle.
	if err := sleepCtx(ctx, min(poolsSettle, time.Since(made))); err != nil {
		return nil, err
	}
	var out []PoolsPoint
	for _, how := range []string{LoadHot, LoadSpread} {
		cfg.progress("pools: %d pools in %d sales, %d reservations (%s) from %d callers", n, sales, cfg.PoolOps, how, cfg.Concurrency)
		p, err := reservePools(ctx, cfg, g, rs, pools, how)
		if err != nil {
			return out, err
		}
		p.Sales = sales
		cfg.progress("pools: %d pools, %s: %.0f reservations/s, p99 %.2f ms", n, how, p.ReservationsPerSec, p.P99Ms)
		out = append(out, p)
	}
	return out, nil
}

// addPools creates sales until there are n pools, and answers them and the sales' count.
func (g *scaleRig) addPools(ctx context.Context, pools []poolRef, n int, units int64) ([]poolRef, int, error) {
	sales := map[string]bool{}
	for _, p := range pools {
		sales[p.sale] = true
	}
	for s := len(sales); len(pools) < n; s++ {
		sale := "pools-" + strconv.Itoa(s)
		var skus []string
		for k := 0; k < skusPerSale && len(pools) < n; k++ {
			skus = append(skus, "sku-"+strconv.Itoa(k))
			pools = append(pools, poolRef{sale, skus[k]})
		}
		if err := g.createSale(ctx, sale, skus, units, coordinator.RebalanceManual, []int64{1}); err != nil {
			return pools, 0, err
		}
		sales[sale] = true
	}
	return pools, len(sales), nil
}

// reservePools makes cfg.PoolOps reservations of one unit each, by distinct users, the n-th
// on pools[n mod len(pools)] (spread) or pools[0] (hot), and checks that each was granted.
func reservePools(ctx context.Context, cfg *ScaleConfig, g *scaleRig, rs quotav1.RegionServiceClient, pools []poolRef, how string) (PoolsPoint, error) {
	prefix := how + strconv.Itoa(len(pools)) + "-"
	spread := int64(len(pools))
	if how == LoadHot {
		spread = 1
	}
	l := load{concurrency: cfg.Concurrency, maxOps: cfg.PoolOps, duration: cfg.Duration, warmup: DefaultWarmup,
		warmupOps: min(300, cfg.PoolOps/10), newAttempt: func(int) attempt {
			return func(ctx context.Context, n int64) (outcome, error) {
				p := pools[n%spread]
				_, err := rs.Reserve(ctx, &quotav1.ReserveRequest{SaleId: p.sale, Sku: p.sku, UserId: prefix + strconv.FormatInt(n, 10),
					Quantity: 1, RequestKey: "k"})
				if err != nil {
					if apierr.Reason(err) == "REGION_EXHAUSTED" {
						return refused, nil
					}
					return failed, err
				}
				return took, nil
			}
		}}
	v := l.run(ctx)
	p := PoolsPoint{Pools: len(pools), Load: how, Concurrency: cfg.Concurrency, Reservations: v.Reservations, Errors: v.Errors + v.Refusals,
		FirstError: v.FirstError, EndedBy: v.EndedBy, MeasuredSec: v.MeasuredSec, ReservationsPerSec: round1(v.ReservationsPerSec),
		P50Ms: v.Latency.P50, P99Ms: v.Latency.P99, ProcessCPUPerOp: v.ProcessCPUPerOp, MachineBusyPct: v.MachineBusyPct, MachineCPUPerOp: v.MachineCPUPerOp}
	if err := g.dev.Regions[0].DB.QueryRow(ctx, `SELECT count(*) FROM holds`).Scan(&p.HoldRows); err != nil {
		return p, fmt.Errorf("count the region's holds: %w", err)
	}
	if ctx.Err() != nil {
		return p, ctx.Err()
	}
	if p.Errors > 0 || p.Reservations != cfg.PoolOps {
		return p, fmt.Errorf("%d pools, %s: %d of %d reservations granted, %d errors (first: %s)", len(pools), how, p.Reservations, cfg.PoolOps, p.Errors, p.FirstError)
	}
	return p, nil
}
