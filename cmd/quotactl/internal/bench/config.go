package bench

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"time"

	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

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
