package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
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

// IdlePoint is one point of the coordinator curve: Sales idle sales of SKUs SKUs each, over
// three regions, watched for WindowSec, the continuous audit every AuditEverySec (0: none).
type IdlePoint struct {
	Mode          string  `json:"mode"`
	Sales         int     `json:"sales"`
	SKUs          int     `json:"skus_per_sale"`
	WindowSec     float64 `json:"window_seconds"`
	AuditEverySec float64 `json:"audit_every_seconds"`
	// TxPerSec is, per region database, the transactions committed (and rolled back) per
	// second over the window, from pg_stat_database's xact_commit and xact_rollback: every
	// statement the coordinator sends outside a transaction is one. MeanTxPerSec is their mean.
	TxPerSec     map[string]float64 `json:"tx_per_sec_by_region_db"`
	MeanTxPerSec float64            `json:"tx_per_sec_per_region_db"`
	// PerSalePerSec is MeanTxPerSec over the sales, less the point with no sale's (0 at it).
	PerSalePerSec float64 `json:"tx_per_sec_per_sale_per_region_db"`
	// LedgerTxPerSec is the same count on the coordinator's own ledger database.
	LedgerTxPerSec float64 `json:"ledger_tx_per_sec"`
	// ProcessCPUPct is this process's CPU over the window in % of one core: the coordinator,
	// the three idle region leaders and etcd. MachineBusyPct is the whole machine's busy
	// share (PostgreSQL and any other work included).
	ProcessCPUPct  float64 `json:"process_cpu_pct_of_one_core"`
	MachineBusyPct float64 `json:"machine_busy_pct"`
	// CoordinatorCPUPct is the coordinator's own share of ProcessCPUPct, from a CPU profile
	// of the window by component (ComponentCPUPct: every component's; "other" the bench's own
	// and the Go runtime's collector, which no component's figure includes).
	CoordinatorCPUPct float64            `json:"coordinator_cpu_pct_of_one_core"`
	ComponentCPUPct   map[string]float64 `json:"cpu_pct_of_one_core_by_component"`
	// AuditMs is how long the continuous audit's last round before the window's end took
	// (quota_audit_last_duration_seconds); 0 if none had run.
	AuditMs float64 `json:"audit_last_round_ms"`
}

// runIdleCurve measures, on two clusters of three regions, what idle sales cost the region
// databases: first with the rebalancer off and manual sales (the sold-out loop alone), then
// with it on and auto sales (both loops).
func runIdleCurve(ctx context.Context, cfg *ScaleConfig, dbs *databases) ([]IdlePoint, error) {
	var out []IdlePoint
	for i, mode := range []string{ModeSoldOutLoop, ModeBothLoops} {
		pts, err := runIdleMode(ctx, cfg, dbs, "id"+strconv.Itoa(i), mode)
		out = append(out, pts...)
		if err != nil {
			return out, fmt.Errorf("%s: %w", mode, err)
		}
	}
	return out, nil
}

// runIdleMode runs one mode's points: none, then cfg.Sales idle sales.
func runIdleMode(ctx context.Context, cfg *ScaleConfig, dbs *databases, tag, mode string) ([]IdlePoint, error) {
	cfg.progress("coordinator: %s: starting a cluster of %v", mode, scaleRegions)
	auto := mode == ModeBothLoops
	g, err := startScaleRig(ctx, cfg, dbs, tag, scaleRegions, auto, cfg.AuditInterval)
	if err != nil {
		return nil, err
	}
	defer g.close()
	admin, err := pgutil.Open(ctx, cfg.PGURL, 2)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	sale := coordinator.RebalanceManual
	if auto {
		sale = coordinator.RebalanceAuto
	}
	var out []IdlePoint
	var skus []string
	for i := range cfg.IdleSKUs {
		skus = append(skus, "sku"+strconv.Itoa(i))
	}
	made := 0
	for _, n := range append([]int{0}, cfg.Sales...) {
		err := inParallel(ctx, n-made, 4, func(ctx context.Context, i int) error {
			return g.createSale(ctx, "idle-"+strconv.Itoa(made+i), skus, 1000, sale, []int64{1, 1, 1})
		})
		if err != nil {
			return out, err
		}
		made = n
		p, err := g.watchIdle(ctx, cfg, admin, tag, mode, n)
		if err != nil {
			return out, err
		}
		if len(out) > 0 && n > 0 {
			p.PerSalePerSec = round3((p.MeanTxPerSec - out[0].MeanTxPerSec) / float64(n))
		}
		cfg.progress("coordinator: %s, %d sales: %.1f tx/s per region database, process CPU %.1f%% of a core (coordinator %.1f%%, by component %v), last audit round %.1f ms",
			mode, n, p.MeanTxPerSec, p.ProcessCPUPct, p.CoordinatorCPUPct, p.ComponentCPUPct, p.AuditMs)
		out = append(out, p)
	}
	return out, nil
}

// idleSettle is how long the coordinator curve waits after creating its sales before it
// watches them: past a new sale's first 30 s open (coordinator.maxIdleBackoff).
const idleSettle = 35 * time.Second

// watchIdle lets the cluster settle after the sales' creation, then counts
// the transactions of every database of the cluster over cfg.IdleWindow.
func (g *scaleRig) watchIdle(ctx context.Context, cfg *ScaleConfig, admin *pgxpool.Pool, tag, mode string, sales int) (IdlePoint, error) {
	// Creating a sale moves its stock to each region, one transfer per SKU, and each step
	// tells the coordinator of a change: the sold-out loop reads the sale again for a few
	// seconds after, and the rebalancer plans a sale every 2 s in its first 30 s open. Idle
	// is after that: wait idleSettle before the window opens (for a window under 10 s, as
	// the tests run, the window's length), then until the region databases are quiet
	// (waitQuiet), which also lets PostgreSQL (it flushes a backend's counts at most once a
	// second) count the creation.
	settle := idleSettle
	if cfg.IdleWindow < 10*time.Second {
		settle = max(time.Second, cfg.IdleWindow)
	}
	if err := sleepCtx(ctx, settle); err != nil {
		return IdlePoint{}, err
	}
	names := map[string]string{"coordinator": cluster.DBName(cfg.DBPrefix+"_"+tag, "coordinator")}
	for _, r := range scaleRegions {
		names[r] = cluster.DBName(cfg.DBPrefix+"_"+tag, r)
	}
	before, err := waitQuiet(ctx, admin, names)
	if err != nil {
		return IdlePoint{}, err
	}
	cpu0, mach0, t0 := processCPU(), readMachineCPU(), time.Now()
	byComponent, err := profileComponents(ctx, cfg.IdleWindow)
	if err != nil {
		return IdlePoint{}, err
	}
	after, err := xacts(ctx, admin, names)
	if err != nil {
		return IdlePoint{}, err
	}
	window := time.Since(t0)
	cpu, mach := processCPU()-cpu0, readMachineCPU()
	p := IdlePoint{Mode: mode, Sales: sales, SKUs: cfg.IdleSKUs, WindowSec: round3(window.Seconds()), AuditEverySec: cfg.AuditInterval.Seconds(), TxPerSec: map[string]float64{},
		ProcessCPUPct: round1(100 * cpu.Seconds() / window.Seconds()), CoordinatorCPUPct: byComponent["coordinator"], ComponentCPUPct: byComponent,
		AuditMs: round1(float64(g.dev.Coordinator.C.AuditDuration().Microseconds()) / 1000)}
	if mach.ok && mach0.ok && mach.total > mach0.total {
		p.MachineBusyPct = round1(100 * float64(mach.busy-mach0.busy) / float64(mach.total-mach0.total))
	}
	for role := range names {
		r := round1(float64(after[role]-before[role]) / window.Seconds())
		if role == "coordinator" {
			p.LedgerTxPerSec = r
			continue
		}
		p.TxPerSec[role] = r
		p.MeanTxPerSec += r / float64(len(scaleRegions))
	}
	p.MeanTxPerSec = round1(p.MeanTxPerSec)
	return p, nil
}

// quietProbe and quietBound: after the settle, the coordinator curve waits until no region
// database's count moves over a quietProbe (longer than PostgreSQL's one second between a
// backend's flushes of its counts), for at most quietBound. On a busy machine the creation's
// last steps and their counts can still be arriving after a short settle; a coordinator that
// polls never falls quiet and is measured as it is once quietBound has passed.
const (
	quietProbe = 1500 * time.Millisecond
	quietBound = 12 * time.Second
)

// waitQuiet waits for the region databases named in names to fall quiet (quietProbe,
// quietBound) and returns the counts of every named database at the last probe.
func waitQuiet(ctx context.Context, admin *pgxpool.Pool, names map[string]string) (map[string]int64, error) {
	prev, err := xacts(ctx, admin, names)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(quietBound); time.Now().Before(deadline); {
		if err := sleepCtx(ctx, quietProbe); err != nil {
			return nil, err
		}
		cur, err := xacts(ctx, admin, names)
		if err != nil {
			return nil, err
		}
		moved := false
		for _, r := range scaleRegions {
			moved = moved || cur[r] != prev[r]
		}
		if prev = cur; !moved {
			break
		}
	}
	return prev, nil
}

// xacts reads xact_commit + xact_rollback of each named database.
func xacts(ctx context.Context, admin *pgxpool.Pool, names map[string]string) (map[string]int64, error) {
	out := map[string]int64{}
	for role, name := range names {
		var n int64
		if err := admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, name).Scan(&n); err != nil {
			return nil, fmt.Errorf("read pg_stat_database of %s: %w", name, err)
		}
		out[role] = n
	}
	return out, nil
}

// sleepCtx is clock.Sleep.
func sleepCtx(ctx context.Context, d time.Duration) error { return clock.Sleep(ctx, d) }

// AuditPoint is one point of the audit curve: a sale with Transfers transfers (its
// allocation's included) and Holds sold holds over three regions.
type AuditPoint struct {
	Transfers int   `json:"transfers"`
	Holds     int64 `json:"holds"`
	// Ms is the median of the timed audits, Runs each of them (ms).
	Ms   float64   `json:"ms"`
	Runs []float64 `json:"runs_ms"`
	// OK is the audit's verdict; it must be true.
	OK         bool `json:"ok"`
	Violations int  `json:"violations"`
}

// auditSale is the audit curve's sale; auditUnits its units (enough for every transfer and hold).
const (
	auditSale  = "audit"
	auditUnits = 90_000_000
)

// runAuditCurve grows one sale's transfers (one unit each, round the three regions, 16 at
// a time), then its stored holds, and times the coordinator's Audit at each point.
func runAuditCurve(ctx context.Context, cfg *ScaleConfig, dbs *databases) ([]AuditPoint, error) {
	cfg.progress("audit: starting a cluster of %v", scaleRegions)
	g, err := startScaleRig(ctx, cfg, dbs, "au", scaleRegions, false, 0)
	if err != nil {
		return nil, err
	}
	defer g.close()
	if err := g.createSale(ctx, auditSale, []string{"sku"}, auditUnits, coordinator.RebalanceManual, []int64{1, 1, 1}); err != nil {
		return nil, err
	}
	var out []AuditPoint
	made := len(scaleRegions) // the allocation's
	for _, n := range cfg.Transfers {
		if err := g.auditTransfers(ctx, cfg, made, n); err != nil {
			return out, err
		}
		made = max(made, n)
		p, err := g.timeAudit(ctx, cfg, made, 0)
		out = append(out, p)
		if err != nil {
			return out, err
		}
	}
	var stored int64
	for _, h := range cfg.AuditHolds {
		if err := g.storeAuditHolds(ctx, stored, h); err != nil {
			return out, err
		}
		stored = max(stored, h)
		p, err := g.timeAudit(ctx, cfg, made, stored)
		out = append(out, p)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// transfers makes transfers from..to-1 of one unit each, region i%3 to region (i+1)%3.
func (g *scaleRig) transfers(ctx context.Context, from, to, width int) error {
	if to <= from {
		return nil
	}
	return inParallel(ctx, to-from, width, func(ctx context.Context, i int) error {
		n := from + i
		src, dst := scaleRegions[n%3], scaleRegions[(n+1)%3]
		tr, err := g.coord.Transfer(ctx, &quotav1.TransferRequest{SaleId: auditSale, Sku: "sku", From: src, To: dst, Units: 1,
			RequestId: "t-" + strconv.Itoa(n)})
		if err != nil {
			return fmt.Errorf("transfer %d: %w", n, err)
		}
		if st := tr.GetTransfer().GetState(); st != "posted" {
			return fmt.Errorf("transfer %d is %s, not posted", n, st)
		}
		return nil
	})
}

// timeAudit audits the sale cfg.AuditRuns times and answers the median time.
func (g *scaleRig) timeAudit(ctx context.Context, cfg *ScaleConfig, transfers int, holds int64) (AuditPoint, error) {
	p := AuditPoint{Transfers: transfers, Holds: holds, OK: true}
	for range cfg.AuditRuns {
		t0 := time.Now()
		rep, err := g.coord.Audit(ctx, &quotav1.AuditRequest{SaleId: auditSale})
		if err != nil {
			return p, fmt.Errorf("audit: %w", err)
		}
		p.Runs = append(p.Runs, round1(float64(time.Since(t0).Microseconds())/1000))
		p.OK = p.OK && rep.GetOk()
		p.Violations = max(p.Violations, len(rep.GetViolations()))
	}
	sorted := slices.Clone(p.Runs)
	sort.Float64s(sorted)
	p.Ms = sorted[len(sorted)/2]
	cfg.progress("audit: %d transfers, %d holds: %.1f ms (median of %d), ok %v", transfers, holds, p.Ms, cfg.AuditRuns, p.OK)
	if !p.OK {
		return p, fmt.Errorf("audit at %d transfers and %d holds found %d violations", transfers, holds, p.Violations)
	}
	return p, nil
}

// storeAuditHolds writes holds from..to-1 of the audit sale as sold holds straight into the
// regions' databases (a third each), moving their units from available to sold in the same
// transaction, so the books stay balanced. The region leaders' memory does not see them:
// nothing reserves from this sale, and the writer only ever adds deltas to a pool's counts.
func (g *scaleRig) storeAuditHolds(ctx context.Context, from, to int64) error {
	for i, r := range g.dev.Regions {
		lo, hi := from+(to-from)*int64(i)/3, from+(to-from)*int64(i+1)/3
		if err := insertClosedHolds(ctx, r.DB, auditSale, "sku", r.R.Name()+"-a", lo, hi, true); err != nil {
			return fmt.Errorf("region %s: %w", r.R.Name(), err)
		}
	}
	return nil
}

// insertClosedHolds stores holds lo..hi-1 of (sale, sku) as sold an hour ago (past any
// retention), with ids, users and keys named after tag and the number, in batches of
// 100,000 rows; with fromAvailable their units come out of the pool's available, otherwise
// they are credited to the pool first (as if allocated and sold).
func insertClosedHolds(ctx context.Context, db *pgxpool.Pool, sale, sku, tag string, lo, hi int64, fromAvailable bool) error {
	const chunk = 100_000
	set := `available = available - n.c, sold = sold + n.c`
	if !fromAvailable {
		set = `credited_in = credited_in + n.c, sold = sold + n.c`
	}
	for a := lo; a < hi; a += chunk {
		b := min(hi, a+chunk)
		res, err := db.Exec(ctx, `WITH ins AS (INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash,
				state, created_at, expires_at, closed_at, payment_id, changed)
			SELECT $3 || '.' || g, $1, $2, $3 || '-u' || g, 1, 'k', md5($3 || g::text), 'sold', now() - interval '2 hours',
				now() + interval '1 hour', now() - interval '1 hour', 'pay-' || g, 0
			FROM generate_series($4::bigint, $5::bigint - 1) g RETURNING 1),
			n AS (SELECT count(*) AS c FROM ins)
			UPDATE pools SET `+set+` FROM n WHERE sale_id = $1 AND sku = $2`, sale, sku, tag, a, b)
		if err != nil {
			return fmt.Errorf("store holds %d..%d: %w", a, b, err)
		}
		if res.RowsAffected() != 1 {
			return fmt.Errorf("store holds %d..%d: no pool %s/%s", a, b, sale, sku)
		}
	}
	return nil
}
