// Package bench is `quotactl bench`: one reproducible run that measures, on the same
// PostgreSQL server and at the same concurrency, the plain-SQL ways of selling one hot SKU
// against this project's region, end to end through gRPC:
//
//	(a) one stock row, SELECT … FOR UPDATE then UPDATE, plus a hold INSERT, one transaction each;
//	(b) one stock row, conditional UPDATE … WHERE available >= 1 RETURNING, plus a hold INSERT;
//	(c) the stock split over K bucket rows: a random start bucket, rolling over to the next
//	    non-empty one (conditional UPDATE), plus a hold INSERT, for each K asked for;
//	(d) RegionService.Reserve on an in-process cluster holding the whole stock in one region;
//	(e) the gRPC health check on the same region server: the transport's ceiling;
//	(f) Reserve on that region once its pool is empty: the sold-out path;
//	(g) the peer a storefront would build instead: the same take as a Redis Lua script on a
//	    redis-server the bench starts, its append-only file fsynced before every answer;
//	(h) the same with the append-only file fsynced once a second;
//	(i) (d) on a region without metrics; (j) (d) on a region that binds no buyer at their
//	    first reservation: what the binding's etcd write costs (every call of (d) is a new
//	    buyer's first reservation).
//
// Every stock variant ((a)–(d), (g), (h)) starts from the same stock and runs until it is sold out, bounded
// by a duration cap and an operation budget; (e) and (f) run a fixed number of calls, also
// under the duration cap. The
// first second (or the first few hundred operations, whichever comes first) of each variant
// is warm-up, excluded from rates and latencies. Clients and servers share one process.
package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// The variants, in the order they run.
const (
	VariantForUpdate   = "a"
	VariantConditional = "b"
	VariantBuckets     = "c"
	VariantRegion      = "d"
	VariantNoop        = "e"
	VariantSoldOut     = "f"
	// VariantRedisAlways is the Redis take with appendfsync always (durable before the answer).
	VariantRedisAlways = "g"
	// VariantRedisEverysec is the Redis take with appendfsync everysec (can lose the last second).
	VariantRedisEverysec = "h"
	// VariantRegionBare is (d) on a region without metrics: what the metrics cost the hot
	// path, side by side.
	VariantRegionBare = "i"
	// VariantRegionUnbound is (d) on a region that binds no buyer at their first reservation
	// (cluster.RegionConfig.NoBindAtReserve): what that binding's etcd write costs, side by
	// side, since every call of (d) is a new buyer's first reservation.
	VariantRegionUnbound = "j"
)

// Defaults of Config.Duration and Config.Warmup.
const (
	DefaultDuration = 30 * time.Second
	DefaultWarmup   = time.Second
)

// AllVariants lists every variant in run order.
var AllVariants = []string{VariantForUpdate, VariantConditional, VariantBuckets, VariantRegion, VariantNoop, VariantSoldOut,
	VariantRedisAlways, VariantRedisEverysec, VariantRegionBare, VariantRegionUnbound}

// DefaultVariants are the ones a run without Variants runs: every one but the Redis peer,
// which needs redis-server installed.
var DefaultVariants = []string{VariantForUpdate, VariantConditional, VariantBuckets, VariantRegion, VariantNoop, VariantSoldOut}

// Setup records what was run and where, so a result can be reproduced and compared.
type Setup struct {
	// Concurrency is the first of Concurrencies: all of them, unless the run swept.
	Concurrency     int            `json:"concurrency"`
	Concurrencies   []int          `json:"concurrencies"`
	StockPerVariant transfer.Units `json:"stock_per_variant"`
	ProbeOps        int64          `json:"probe_ops"`
	DurationCapSec  float64        `json:"duration_cap_seconds"`
	WarmupSec       float64        `json:"warmup_seconds"`
	WarmupOps       int64          `json:"warmup_ops"`
	SQLConns        int            `json:"sql_pool_conns"`
	// SQLConnsPerRun is set when a sweep sized the pool min(concurrency, 64) at each
	// concurrency; SQLConns is then the first one's.
	SQLConnsPerRun    bool     `json:"sql_pool_per_concurrency,omitempty"`
	Buckets           []int    `json:"buckets"`
	Variants          []string `json:"variants"`
	Seed              uint64   `json:"seed"`
	Rounds            int      `json:"rounds"`
	PostgreSQL        string   `json:"postgresql_version"`
	SynchronousCommit string   `json:"synchronous_commit"`
	GoVersion         string   `json:"go_version"`
	GOMAXPROCS        int      `json:"gomaxprocs"`
	GC                string   `json:"go_gc"`
	Region            string   `json:"region_tuning"`
	NumCPU            int      `json:"num_cpu"`
	Placement         string   `json:"placement"`
	// RedisServer is `redis-server --version` of (g) and (h), when they ran.
	RedisServer string    `json:"redis_server,omitempty"`
	Started     time.Time `json:"started"`
	// LoadAvgStart and LoadAvgEnd are the machine's 1, 5 and 15 minute load averages before
	// and after the run (Linux; empty elsewhere): anything else running skews the numbers.
	LoadAvgStart string `json:"load_avg_start,omitempty"`
	LoadAvgEnd   string `json:"load_avg_end,omitempty"`
}

// loadAvg reads the first three fields of /proc/loadavg, or "".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Placement says where the clients and servers ran: it qualifies every number.
const Placement = "load generator, region, coordinator and etcd all in this one process; PostgreSQL on the same machine; " +
	"gRPC over loopback TCP, one client connection"

// RedisPlacement is added to Placement when (g) or (h) run.
const RedisPlacement = "; (g) and (h): redis-server a process of its own on the same machine, one connection per caller over loopback TCP"

func (c *Config) setup() Setup {
	return Setup{Concurrency: c.Concurrency, Concurrencies: c.Concurrencies, StockPerVariant: c.Stock, ProbeOps: c.ProbeOps, DurationCapSec: c.Duration.Seconds(),
		WarmupSec: c.Warmup.Seconds(), WarmupOps: c.WarmupOps, SQLConns: c.SQLConns, SQLConnsPerRun: c.sqlConnsDefault && len(c.Concurrencies) > 1, Buckets: c.Buckets, Variants: c.Variants,
		Seed: c.Seed, Rounds: c.Rounds, GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), GC: c.GC.String(), Region: c.regionTuning(), NumCPU: runtime.NumCPU(),
		Placement: Placement, Started: time.Now().UTC().Truncate(time.Second), LoadAvgStart: loadAvg()}
}

// regionTuning describes the region's writer settings (Validate filled in the defaults).
func (c *Config) regionTuning() string {
	return fmt.Sprintf("max batch %d, batch window %s", c.Region.Writer.MaxBatch, c.Region.Writer.BatchWindow)
}

// describeServer reads the server's version and commit durability.
func describeServer(ctx context.Context, url string, s *Setup) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit')`).
		Scan(&s.PostgreSQL, &s.SynchronousCommit); err != nil {
		return fmt.Errorf("read server settings: %w", err)
	}
	return nil
}

// VariantResult is one variant's outcome. Rates and latencies cover the measured window
// only (after warm-up); counts of units and operations cover the whole run.
type VariantResult struct {
	Variant string `json:"variant"` // a, b, c<K>, d, e, f
	Round   int    `json:"round"`   // 1..Config.Rounds
	// Concurrency is how many callers it ran with.
	Concurrency int    `json:"concurrency"`
	Label       string `json:"label"`
	Buckets     int    `json:"buckets,omitempty"`
	// Stock is what the variant started with; for (f), what was left (0).
	Stock transfer.Units `json:"stock"`
	// Sold is the units whose reservation was acknowledged to the caller.
	Sold transfer.Units `json:"sold"`
	// HoldRows counts the hold rows found in the database afterwards (for (f), the new ones).
	HoldRows int64 `json:"hold_rows"`
	// Remaining is the stock left in the database afterwards.
	Remaining transfer.Units `json:"remaining"`
	// Oversell is max(sold, hold rows) − stock when positive; it must be 0.
	Oversell transfer.Units `json:"oversell"`
	// Check is "ok", or what disagreed between the answers and the database.
	Check string `json:"check"`
	// EndedBy is why the run stopped: "sold out", "ops" (the budget), "duration", "canceled".
	EndedBy            string  `json:"ended_by"`
	Ops                int64   `json:"ops"`
	Reservations       int64   `json:"reservations"`
	Refusals           int64   `json:"refusals"`
	Errors             int64   `json:"errors"`
	FirstError         string  `json:"first_error,omitempty"`
	WarmupOps          int64   `json:"warmup_ops"`
	MeasuredOps        int64   `json:"measured_ops"`
	MeasuredSec        float64 `json:"measured_seconds"`
	ReservationsPerSec float64 `json:"reservations_per_sec"`
	OpsPerSec          float64 `json:"ops_per_sec"`
	Latency            Latency `json:"latency"`
	// ProcessCPUPerOp is the CPU this process used during the variant (user and system, warm-up
	// included) per operation, in µs: the clients' work, and for (d)–(f) the servers' too, but
	// not PostgreSQL's. Less noisy than a rate when the machine's speed drifts.
	ProcessCPUPerOp float64 `json:"process_cpu_us_per_op"`
	// MachineBusyPct is the share of the whole machine's CPU time that was busy during the
	// variant (warm-up included), from /proc/stat: this process, PostgreSQL and anything else.
	// A closed loop that waits (for a commit, say) leaves the machine partly idle. 0: unknown.
	MachineBusyPct float64 `json:"machine_busy_pct,omitempty"`
	// MachineCPUPerOp is the machine's busy CPU time during the variant per operation, in µs:
	// ProcessCPUPerOp plus PostgreSQL's share (and the kernel's, and any other process's).
	// Rate ≈ CPUs × MachineBusyPct/100 ÷ MachineCPUPerOp. The kernel counts it in 10 ms
	// ticks, so it agrees with ProcessCPUPerOp (exact) to a few percent. 0: unknown.
	MachineCPUPerOp float64 `json:"machine_cpu_us_per_op,omitempty"`
	// ServerCPUPerOp, for (g) and (h), is the redis-server process's CPU during the variant
	// per operation, in µs (Linux, 10 ms ticks): ProcessCPUPerOp is the client's side only.
	ServerCPUPerOp float64 `json:"server_cpu_us_per_op,omitempty"`
	Skipped        string  `json:"skipped,omitempty"`
}

// Report is a whole run: the setup, every variant, the best K of (c), and the ratios that
// have targets.
type Report struct {
	Setup       Setup           `json:"setup"`
	Variants    []VariantResult `json:"variants"`
	BestBuckets int             `json:"best_buckets,omitempty"`
	// Ratios are the targets' ratios, every variant at one concurrency: in a sweep, at
	// PeakConcurrency (Report.finish).
	Ratios []Ratio `json:"ratios"`
	// PeakConcurrency, in a sweep only, is the concurrency of Ratios: where (d) peaked.
	PeakConcurrency int `json:"peak_concurrency,omitempty"`
	// AtConcurrency, in a sweep only, has the same ratios at each concurrency on its own.
	AtConcurrency []ConcurrencyRatios `json:"at_concurrency,omitempty"`
	// Budget splits (d)/(e) into how busy each kept the machine and what one operation cost
	// it; nil without both variants' machine figures.
	Budget *Budget `json:"d_over_e_budget,omitempty"`
	// Binding is (d) beside (j): what binding each new buyer in etcd costs; nil unless both
	// ran.
	Binding *BindingCost `json:"binding_cost,omitempty"`
}

// Run runs the configured variants one after another and reports them. Every database it
// creates is dropped before it returns, also on error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{Setup: cfg.setup()}
	defer gcconf.Apply(gcconf.Apply(cfg.GC))
	if cfg.wants(VariantForUpdate, VariantConditional, VariantBuckets, VariantRegion, VariantNoop, VariantSoldOut) {
		if err := describeServer(ctx, cfg.PGURL, &rep.Setup); err != nil {
			return nil, err
		}
	}
	if err := cfg.findRedis(ctx, &rep.Setup); err != nil {
		return nil, err
	}
	dbs := &databases{admin: cfg.PGURL}
	defer func() {
		if err := dbs.dropAll(); err != nil {
			cfg.progress("cleanup: %v", err)
		}
	}()
	for round := 1; round <= cfg.Rounds; round++ {
		for _, n := range cfg.Concurrencies {
			at := cfg
			at.Concurrency = n
			if cfg.sqlConnsDefault {
				at.SQLConns = min(n, 64)
			}
			if len(cfg.Concurrencies) > 1 {
				at.DBPrefix = fmt.Sprintf("%s_n%d", cfg.DBPrefix, n)
				cfg.progress("%d callers", n)
			}
			res, err := runRound(ctx, at, dbs, round)
			if err != nil {
				return nil, err
			}
			rep.Variants = append(rep.Variants, res...)
		}
	}
	rep.finish()
	rep.Setup.LoadAvgEnd = loadAvg()
	return rep, nil
}

// runRound runs every variant once; with more than one round, in databases of their own
// (<db-prefix>_r<round>_...).
func runRound(ctx context.Context, cfg Config, dbs *databases, round int) ([]VariantResult, error) {
	if cfg.Rounds > 1 {
		cfg.DBPrefix = fmt.Sprintf("%s_r%d", cfg.DBPrefix, round)
		cfg.progress("round %d of %d", round, cfg.Rounds)
	}
	var out []VariantResult
	for _, v := range cfg.sqlVariants() {
		res, err := runSQL(ctx, &cfg, dbs, v)
		if err != nil {
			return nil, fmt.Errorf("variant %s: %w", v.name, err)
		}
		cfg.progress("%s", res.oneLine())
		out = append(out, res)
	}
	res, err := runRegions(ctx, &cfg, dbs, round)
	if err != nil {
		return nil, err
	}
	out = append(out, res...)
	for _, v := range cfg.redisVariants() {
		res, err := runRedis(ctx, &cfg, v)
		if err != nil {
			return nil, fmt.Errorf("variant %s: %w", v.name, err)
		}
		cfg.progress("%s", res.oneLine())
		out = append(out, res)
	}
	for i := range out {
		out[i].Round, out[i].Concurrency = round, cfg.Concurrency
	}
	return out, nil
}

// runRegions runs the in-process cluster's variants: (d)–(f) on one cluster, (i) and (j)
// each on one of its own. Even rounds run them in the reverse order, so that none always
// pays for starting first (a fresh process's heap, a cold database).
func runRegions(ctx context.Context, cfg *Config, dbs *databases, round int) ([]VariantResult, error) {
	var out []VariantResult
	region := func() error {
		if !cfg.wants(VariantRegion, VariantNoop, VariantSoldOut) {
			return nil
		}
		res, err := runRegion(ctx, cfg, dbs)
		out = append(out, res...)
		return err
	}
	again := func(variant string) func() error {
		return func() error {
			if !cfg.wants(variant) {
				return nil
			}
			res, err := runAgain(ctx, cfg, dbs, variant)
			if err != nil {
				return fmt.Errorf("variant %s: %w", variant, err)
			}
			cfg.progress("%s", res.oneLine())
			out = append(out, res)
			return nil
		}
	}
	runs := []func() error{region, again(VariantRegionBare), again(VariantRegionUnbound)}
	if round%2 == 0 {
		slices.Reverse(runs)
	}
	for _, run := range runs {
		if err := run(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (v VariantResult) oneLine() string {
	if v.Skipped != "" {
		return fmt.Sprintf("(%s) %s: skipped: %s", v.Variant, v.Label, v.Skipped)
	}
	return fmt.Sprintf("(%s) %s: %d ops, %d reserved, %.0f reservations/s, %.0f ops/s, p99 %.2f ms, %d errors, ended by %s, check %s",
		v.Variant, v.Label, v.Ops, v.Reservations, v.ReservationsPerSec, v.OpsPerSec, v.Latency.P99, v.Errors, v.EndedBy, v.Check)
}

// checkUnits fills Oversell and Check from the answers (Sold) and the database (HoldRows,
// Remaining), given the units the variant started with.
func (v *VariantResult) checkUnits(remainingKnown bool) {
	seen := max(v.Sold, transfer.Units(v.HoldRows))
	v.Oversell = max(0, seen-v.Stock)
	var problems []string
	if v.Oversell > 0 {
		problems = append(problems, fmt.Sprintf("OVERSOLD by %d", v.Oversell))
	}
	if transfer.Units(v.HoldRows) != v.Sold {
		problems = append(problems, fmt.Sprintf("%d units acknowledged but %d hold rows", v.Sold, v.HoldRows))
	}
	if remainingKnown && transfer.Units(v.HoldRows)+v.Remaining != v.Stock {
		problems = append(problems, fmt.Sprintf("hold rows %d + remaining %d != stock %d", v.HoldRows, v.Remaining, v.Stock))
	}
	v.Check = "ok"
	if len(problems) > 0 {
		v.Check = fmt.Sprint(problems)
	}
}

// medianAt is a variant's figures at n callers over its rounds: the median of each rate and
// of the p99 (nil when the variant did not run).
func (r *Report) medianAt(name string, n int) *VariantResult {
	var rs []VariantResult
	for _, v := range r.Variants {
		if v.Variant == name && v.Concurrency == n && v.Skipped == "" {
			rs = append(rs, v)
		}
	}
	if len(rs) == 0 {
		return nil
	}
	m := rs[0]
	m.ReservationsPerSec = medianOf(rs, func(v VariantResult) float64 { return v.ReservationsPerSec })
	m.OpsPerSec = medianOf(rs, func(v VariantResult) float64 { return v.OpsPerSec })
	m.Latency.P99 = medianOf(rs, func(v VariantResult) float64 { return v.Latency.P99 })
	m.ProcessCPUPerOp = medianOf(rs, func(v VariantResult) float64 { return v.ProcessCPUPerOp })
	m.MachineBusyPct = medianOf(rs, func(v VariantResult) float64 { return v.MachineBusyPct })
	m.MachineCPUPerOp = medianOf(rs, func(v VariantResult) float64 { return v.MachineCPUPerOp })
	return &m
}

// medianOf is the median of f over rs (the mean of the middle two for an even count).
func medianOf(rs []VariantResult, f func(VariantResult) float64) float64 {
	xs := make([]float64, len(rs))
	for i, v := range rs {
		xs[i] = f(v)
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// databases are the ones a run created, dropped at the end.
type databases struct {
	admin string
	names []string
}

// track records names to drop at the end (before they exist, so a failed start is cleaned up).
func (d *databases) track(names ...string) {
	for _, n := range names {
		if !slices.Contains(d.names, n) {
			d.names = append(d.names, n)
		}
	}
}

// create makes an empty database name and returns its URL.
func (d *databases) create(ctx context.Context, name string) (string, error) {
	d.track(name)
	if err := pgutil.DropDatabase(ctx, d.admin, name); err != nil { // a leftover of an interrupted run
		return "", err
	}
	if err := pgutil.EnsureDatabase(ctx, d.admin, name); err != nil {
		return "", err
	}
	return pgutil.WithDatabase(d.admin, name)
}

// dropAll drops every tracked database, with its own deadline (the run's context may be over).
func (d *databases) dropAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, n := range d.names {
		if err := pgutil.DropDatabase(ctx, d.admin, n); err != nil {
			errs = append(errs, fmt.Errorf("drop database %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}
