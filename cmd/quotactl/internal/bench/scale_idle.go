package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/pgutil"
)

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
