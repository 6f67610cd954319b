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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/region"
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

// Config is one bench run. Zero values take the defaults documented on each field.
type Config struct {
	// PGURL names the PostgreSQL server and a database to create the bench's databases from.
	PGURL string
	// DBPrefix prefixes every database the run creates (and drops at the end); default
	// quota_bench_<random>.
	DBPrefix string
	// Concurrency is how many callers run at once in every variant; default 64. With
	// Concurrencies set, it is the one running now (Run sets it).
	Concurrency int
	// Concurrencies, with more than one value, make a sweep: every round runs every variant
	// at each of them, and the ratios are taken where (d) peaks (Report.finish).
	// Default: [Concurrency].
	Concurrencies []int
	// Stock is the units each stock variant (a–d) starts with; default 20,000.
	Stock transfer.Units
	// ProbeOps is how many calls (e) and (f) make; default 5 × Stock (they are fast, and a
	// run of a fraction of a second would measure noise).
	ProbeOps int64
	// Duration caps each variant; default 30s.
	Duration time.Duration
	// Warmup and WarmupOps end the warm-up, whichever comes first; defaults 1s and
	// min(300, Stock/10).
	Warmup    time.Duration
	WarmupOps int64
	// Variants to run, from AllVariants; default DefaultVariants.
	Variants []string
	// Buckets are the K of variant (c); default 4, 16, 64.
	Buckets []int
	// SQLConns is the pgx pool size of (a)–(c); default min(concurrency, 64), at each
	// concurrency of a sweep.
	SQLConns int
	// sqlConnsDefault records that SQLConns was left to its default, so a sweep sizes the
	// pool for each concurrency.
	sqlConnsDefault bool
	// Seed makes users and bucket choices reproducible.
	Seed uint64
	// Rounds runs every variant this many times, one round after another, each in fresh
	// databases; the ratios are taken over each variant's medians. Default 1.
	Rounds int
	// GC is the Go collector's setting for the run, applied to the whole process (every
	// variant, clients and servers alike) and restored at the end; default the servers'
	// (gcconf.Default), so the region runs as `quotad` runs it.
	GC gcconf.Config
	// RedisServer is the redis-server binary of (g) and (h); default redis-server on PATH,
	// else /usr/bin/redis-server.
	RedisServer string
	// Region tunes the region of (d)–(f) (MaxBatch, BatchWindow); zero
	// values take the region's defaults, as `quotad` does.
	Region region.Config
	// Logger receives the in-process cluster's messages; default warnings to stderr.
	Logger *slog.Logger
	// Progress, when set, is told about each step as it happens.
	Progress func(msg string)
}

var prefixPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// Validate checks the configuration, naming the bad field, and fills in defaults.
func (c *Config) Validate() error {
	c.fillDefaults()
	switch {
	case c.PGURL == "":
		return errors.New("pg-url: must be set")
	case !prefixPattern.MatchString(c.DBPrefix):
		return fmt.Errorf("db-prefix %q: must be 1..40 lowercase letters, digits and _, starting with a letter", c.DBPrefix)
	case c.checkConcurrencies() != nil:
		return c.checkConcurrencies()
	case len(c.DBPrefix)+c.longestDBSuffix() > maxDBName:
		return fmt.Errorf("db-prefix %q: too long for this run's databases (%d bytes of suffix, PostgreSQL allows %d in all): at most %d characters",
			c.DBPrefix, c.longestDBSuffix(), maxDBName, maxDBName-c.longestDBSuffix())
	case c.Stock < 1 || c.Stock > 100_000_000:
		return fmt.Errorf("stock %d: must be 1..100000000", c.Stock)
	case c.ProbeOps < 1 || c.ProbeOps > 500_000_000:
		return fmt.Errorf("probe-ops %d: must be 1..500000000", c.ProbeOps)
	case c.Duration < 100*time.Millisecond || c.Duration > time.Hour:
		return fmt.Errorf("duration %s: must be 100ms..1h", c.Duration)
	case c.Warmup < 0 || c.Warmup >= c.Duration || c.WarmupOps < 0:
		return fmt.Errorf("warmup %s / %d ops: must be non-negative and shorter than the duration %s", c.Warmup, c.WarmupOps, c.Duration)
	case c.Rounds < 1 || c.Rounds > 20:
		return fmt.Errorf("rounds %d: must be 1..20", c.Rounds)
	case c.SQLConns < 1 || c.SQLConns > slices.Min(c.Concurrencies):
		return fmt.Errorf("sql conns %d: must be 1..concurrency (%d)", c.SQLConns, slices.Min(c.Concurrencies))
	}
	if _, err := pgutil.WithDatabase(c.PGURL, "x"); err != nil {
		return fmt.Errorf("pg-url: %w", err)
	}
	if err := c.GC.Validate(); err != nil {
		return err
	}
	// The region's Validate fills its defaults in and wants a name; the in-process cluster
	// names its region itself.
	c.Region.Name = "x"
	if err := c.Region.Validate(); err != nil {
		return err
	}
	c.Region.Name = ""
	if err := c.checkVariants(); err != nil {
		return err
	}
	return c.checkBuckets()
}

func (c *Config) fillDefaults() {
	if c.DBPrefix == "" {
		c.DBPrefix = fmt.Sprintf("quota_bench_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	}
	if len(c.Concurrencies) == 0 {
		c.Concurrencies = []int{cmp.Or(c.Concurrency, 64)}
	}
	c.Concurrency = c.Concurrencies[0]
	if c.Stock == 0 {
		c.Stock = 20_000
	}
	if c.ProbeOps == 0 {
		c.ProbeOps = 5 * int64(c.Stock)
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
	}
	if c.WarmupOps == 0 {
		c.WarmupOps = min(300, int64(c.Stock)/10)
	}
	if len(c.Variants) == 0 {
		c.Variants = slices.Clone(DefaultVariants)
	}
	if len(c.Buckets) == 0 {
		c.Buckets = []int{4, 16, 64}
	}
	if c.SQLConns == 0 {
		c.sqlConnsDefault = true
		c.SQLConns = min(slices.Min(c.Concurrencies), 64)
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.GC == (gcconf.Config{}) {
		c.GC = gcconf.Default()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
}

// maxDBName is PostgreSQL's longest identifier, in bytes.
const maxDBName = 63

// longestDBSuffix is the longest suffix a database name of this run gets after the prefix:
// _n<callers> in a sweep, _r<round> with rounds, then the in-process cluster's
// _cl_coordinator, longer than any SQL variant's.
func (c *Config) longestDBSuffix() int {
	n := len("_cl_coordinator")
	if len(c.Concurrencies) > 1 {
		n += len(fmt.Sprintf("_n%d", slices.Max(c.Concurrencies)))
	}
	if c.Rounds > 1 {
		n += len(fmt.Sprintf("_r%d", c.Rounds))
	}
	return n
}

// checkConcurrencies checks the callers of each run: 1..10000, none twice.
func (c *Config) checkConcurrencies() error {
	for i, n := range c.Concurrencies {
		if n < 1 || n > 10_000 {
			return fmt.Errorf("concurrency %d: must be 1..10000", n)
		}
		if slices.Contains(c.Concurrencies[:i], n) {
			return fmt.Errorf("concurrency %d: given twice", n)
		}
	}
	return nil
}

func (c *Config) checkVariants() error {
	seen := map[string]bool{}
	for _, v := range c.Variants {
		if !slices.Contains(AllVariants, v) {
			return fmt.Errorf("variants: %q is not one of a, b, c, d, e, f, g, h, i, j", v)
		}
		if seen[v] {
			return fmt.Errorf("variants: %q listed twice", v)
		}
		seen[v] = true
	}
	c.Variants = slices.DeleteFunc(slices.Clone(AllVariants), func(v string) bool { return !seen[v] })
	return nil
}

func (c *Config) checkBuckets() error {
	seen := map[int]bool{}
	for _, k := range c.Buckets {
		if k < 2 || k > 1024 {
			return fmt.Errorf("buckets: %d must be 2..1024", k)
		}
		if seen[k] {
			return fmt.Errorf("buckets: %d listed twice", k)
		}
		seen[k] = true
	}
	return nil
}

func (c *Config) wants(variants ...string) bool {
	for _, v := range variants {
		if slices.Contains(c.Variants, v) {
			return true
		}
	}
	return false
}

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		c.Progress(fmt.Sprintf(format, args...))
	}
}

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

// outcome is how one operation ended.
type outcome int

const (
	took     outcome = iota // a unit was reserved
	refused                 // the stock is gone (sold out, REGION_EXHAUSTED)
	answered                // a no-op call answered as expected
	failed                  // an error
)

// attempt runs one operation; n is its sequence number in the variant, distinct for every
// operation (users are named after it).
type attempt func(ctx context.Context, n int64) (outcome, error)

// load is how a variant is driven: concurrency workers, each running attempts back to back
// until the stock is gone (when stopWhenRefused), maxOps attempts were started, or duration
// passed since the start.
type load struct {
	concurrency     int
	maxOps          int64
	duration        time.Duration
	warmup          time.Duration
	warmupOps       int64
	stopWhenRefused bool
	// newAttempt builds worker w's attempt function (each worker has its own, e.g. its own rng).
	newAttempt func(w int) attempt
}

// stockLoad drives a variant that sells cfg.Stock units until sold out.
func (c *Config) stockLoad(a func(w int) attempt) load {
	return load{concurrency: c.Concurrency, maxOps: 2*int64(c.Stock) + int64(c.Concurrency), duration: c.Duration,
		warmup: c.Warmup, warmupOps: c.WarmupOps, stopWhenRefused: true, newAttempt: a}
}

// probeLoad drives a variant that makes cfg.ProbeOps calls.
func (c *Config) probeLoad(a func(w int) attempt) load {
	return load{concurrency: c.Concurrency, maxOps: c.ProbeOps, duration: c.Duration, warmup: c.Warmup,
		warmupOps: min(c.WarmupOps, c.ProbeOps/10), newAttempt: a}
}

// workerStats is what one worker measured after warm-up; only that worker writes it.
type workerStats struct {
	rec          recorder
	counts       [4]int64 // by outcome, warm-up included
	measured     int64
	measuredTook int64
	lastEnd      time.Duration // of the last measured operation, since the start
	firstErr     error
}

type loadRun struct {
	load
	start    time.Time
	next     atomic.Int64
	done     atomic.Int64 // operations completed while warming up
	warm     atomic.Bool
	warmEnd  atomic.Int64 // since start, ns
	endOnce  sync.Once
	endedBy  string
	workers  []workerStats
	stopping atomic.Bool
}

// run drives the load and returns its totals.
func (l load) run(ctx context.Context) VariantResult {
	cpu0, mach0 := processCPU(), readMachineCPU()
	r := &loadRun{load: l, start: time.Now(), workers: make([]workerStats, l.concurrency)}
	if l.warmup <= 0 && l.warmupOps <= 0 {
		r.warm.Store(true)
	}
	var wg sync.WaitGroup
	for w := range l.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker(ctx, w)
		}()
	}
	wg.Wait()
	v := r.result()
	if v.Ops > 0 {
		v.ProcessCPUPerOp = round1(float64(processCPU()-cpu0) / float64(time.Microsecond) / float64(v.Ops))
	}
	readMachineCPU().since(mach0, &v)
	return v
}

// processCPU is the user and system CPU time this process has used (0 where unknown).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r *loadRun) end(why string) {
	r.endOnce.Do(func() { r.endedBy = why })
	r.stopping.Store(true)
}

// proceed says whether a worker may start another attempt.
func (r *loadRun) proceed(ctx context.Context) bool {
	switch {
	case r.stopping.Load():
		return false
	case ctx.Err() != nil:
		r.end("canceled")
	case time.Since(r.start) >= r.duration:
		r.end("duration")
	default:
		return true
	}
	return false
}

func (r *loadRun) worker(ctx context.Context, w int) {
	try := r.newAttempt(w)
	ws := &r.workers[w]
	for r.proceed(ctx) {
		n := r.next.Add(1) - 1
		if n >= r.maxOps {
			r.end("ops")
			return
		}
		t0 := time.Now()
		out, err := try(ctx, n)
		t1 := time.Now()
		ws.counts[out]++
		if out == failed && ws.firstErr == nil {
			ws.firstErr = err
		}
		if r.measured(t1.Sub(r.start)) {
			ws.rec.add(t1.Sub(t0))
			ws.measured++
			if out == took {
				ws.measuredTook++
			}
			ws.lastEnd = t1.Sub(r.start)
		}
		if out == refused && r.stopWhenRefused {
			r.end("sold out")
		}
	}
}

// measured says whether an operation that ended at since (from the start) counts: once the
// warm-up has ended, every completion does.
func (r *loadRun) measured(since time.Duration) bool {
	if r.warm.Load() {
		return true
	}
	if n := r.done.Add(1); n >= r.warmupOps || since >= r.warmup {
		if r.warm.CompareAndSwap(false, true) {
			r.warmEnd.Store(int64(since))
		}
	}
	return false
}

func (r *loadRun) result() VariantResult {
	var v VariantResult
	var lastEnd time.Duration
	var measuredTook int64
	recs := make([]recorder, len(r.workers))
	for i := range r.workers {
		ws := &r.workers[i]
		v.Reservations += ws.counts[took]
		v.Refusals += ws.counts[refused]
		v.Errors += ws.counts[failed]
		v.Ops += ws.counts[took] + ws.counts[refused] + ws.counts[answered] + ws.counts[failed]
		v.MeasuredOps += ws.measured
		measuredTook += ws.measuredTook
		lastEnd = max(lastEnd, ws.lastEnd)
		recs[i] = ws.rec
		if v.FirstError == "" && ws.firstErr != nil {
			v.FirstError = ws.firstErr.Error()
		}
	}
	v.EndedBy = r.endedBy
	v.WarmupOps = v.Ops - v.MeasuredOps
	window := max(0, lastEnd-time.Duration(r.warmEnd.Load()))
	v.MeasuredSec = math.Round(window.Seconds()*1000) / 1000
	v.ReservationsPerSec = rate(measuredTook, window)
	v.OpsPerSec = rate(v.MeasuredOps, window)
	v.Latency = summarize(merge(recs))
	v.Sold = transfer.Units(v.Reservations)
	return v
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
