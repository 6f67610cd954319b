package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/cmd/quotactl/internal/bench"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Compare plain-SQL reservation schemes with this project's region, in one run",
		Long: `bench measures, on the same PostgreSQL and at the same concurrency, one after another:
  (a) one stock row: SELECT ... FOR UPDATE, UPDATE, hold INSERT, one transaction per reservation
  (b) one stock row: UPDATE ... WHERE available >= 1 RETURNING, hold INSERT
  (c) the stock over K bucket rows: random start bucket, roll over to the next non-empty one,
      hold INSERT; once per --buckets K, the best K reported
  (d) RegionService.Reserve over gRPC on an in-process cluster (embedded etcd, coordinator,
      one region holding the whole stock), distinct users: each call a new buyer's first
      reservation, which binds the buyer to the region in etcd before it is decided
  (e) the gRPC health check on the same region server: the transport's ceiling
  (f) Reserve on that region once its pool is empty: every answer must be REGION_EXHAUSTED
  (g) the peer a storefront would build instead: the same take as a Redis Lua script (per-user
      limit, stock check and decrement, hold hash indexed by expiry, request key so a retry
      replays) on a redis-server the bench starts on a loopback port in a scratch directory,
      appendonly yes with appendfsync always (durable before the answer), one connection per
      caller; not run by default (--variants d,g,h); needs redis-server (scripts/redis-setup.sh)
  (h) the same with appendfsync everysec (can lose the last second)
  (i) (d) on a cluster of its own whose region has no metrics: what they cost (--variants d,i)
  (j) (d) on a cluster of its own whose region binds no buyer at their first reservation: what
      the binding's etcd write costs, every call of (d) being a new buyer's first reservation
      (--variants d,j); printed beside (d) as d/j, with no target
(a)-(d), (g) and (h) each start with --stock units and run until sold out (capped by --duration); (e)
and (f) make --probe-ops calls (default 5 × --stock). Each variant's warm-up (--warmup or
--warmup-ops, whichever ends first) is excluded from rates and latencies. (a)-(c) each get a
fresh database named <db-prefix>_<variant>; every database is dropped at the end. The load
generator and every server run in this one process; PostgreSQL is wherever --pg-url says.
Each variant also reports the CPU this process used per operation, and on Linux how busy the
whole machine was and its CPU per operation (PostgreSQL included), which take (d)/(e) apart
into utilization × cost. --rounds N runs them all
N times and takes the ratios over each variant's medians, for a machine whose speed drifts.
A list of --concurrency values sweeps: each round runs every variant at each concurrency; the
ratios are then taken at the benchmark's peak, the concurrency where (d)'s median
reservations/s is highest, every variant at that same concurrency, and are also printed at
each concurrency. With (g) and (h), (d)/(g) (target >= 1) and (d)/(h) (target >= 0.6) are
printed too; after each, the bench checks on the server that the units held equal the units
acknowledged and never exceed the stock, that no user is above the limit, and that a retry
of a taken request replays its hold. The figures, with the commands that measured them, are
in docs/benchmarks.md.`,
		Example: `  quotactl bench
  quotactl bench --rounds 5
  quotactl bench --variants d,e,f --stock 300000 --probe-ops 300000 --concurrency 64,256,512,1024 --rounds 3
  quotactl bench --variants b,d,e --stock 5000 -o json
  quotactl bench --variants d,g,h --concurrency 256,1024 --stock 100000
  quotactl bench --variants d,j --concurrency 256 --stock 100000 --rounds 3`,
		Args: cobra.NoArgs,
		RunE: withEnv(runBench),
	}
	f := cmd.Flags()
	f.String("concurrency", "64", "callers in flight at once, in every variant; a list (64,256,1024) sweeps: every variant at each, the ratios where (d) peaks")
	f.Int64("stock", 20000, "units each of (a)-(d) starts with")
	f.Int64("probe-ops", 0, "calls (e) and (f) make; default 5 × --stock")
	f.Duration("duration", bench.DefaultDuration, "cap on each variant's run")
	f.Duration("warmup", bench.DefaultWarmup, "warm-up excluded from the stats (or --warmup-ops, whichever ends first)")
	f.Int64("warmup-ops", 0, "operations excluded as warm-up; default min(300, stock/10)")
	f.String("pg-url", "postgres://quota:quota@127.0.0.1:5432/postgres", "URL of the PostgreSQL server on which to create (and drop) the bench's databases (--db-prefix); its own database is only connected to")
	f.String("db-prefix", "", "prefix of the databases the bench creates and drops; default quota_bench_<pid>_<n>")
	f.String("variants", strings.Join(bench.DefaultVariants, ","), "variants to run, of a,b,c,d,e,f,g,h,i,j")
	f.String("buckets", "4,16,64", "bucket counts K of variant (c)")
	f.Int("sql-conns", 0, "pgx pool size of (a)-(c); default min(concurrency, 64)")
	f.String("redis-server", "", "(g), (h): the redis-server binary; default redis-server on PATH, else /usr/bin/redis-server")
	f.Uint64("seed", 1, "random seed (users, start buckets)")
	f.Int("rounds", 1, "run every variant this many times, round after round; ratios over the medians")
	cliconf.AddGCFlags(f)
	f.Int("max-batch", 256, "(d)-(f): most operations one region transaction commits")
	f.Duration("batch-window", 0, "(d)-(f): how long the region's writer waits for more operations after the first")
	f.String("cpuprofile", "", "write a CPU profile of the whole run (every variant, load generator and servers) to this file")
	f.String("memprofile", "", "write a heap profile (allocations over the whole run, and what is live at its end) to this file")
	cmd.AddCommand(benchRebalanceCmd())
	cmd.AddCommand(benchScaleCmd())
	return cmd
}

func runBench(e *env) error {
	cfg, err := benchConfig(e)
	if err != nil {
		return err
	}
	cfg.Progress = func(msg string) { fmt.Fprintf(os.Stderr, "bench: %s %s\n", time.Now().Format("15:04:05"), msg) }
	// Not e.ctx: --timeout bounds one call, and a bench runs for minutes. An interrupt
	// still stops it, and the databases are dropped on the way out.
	ctx, stop := signal.NotifyContext(e.cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cfg.Validate(); err != nil {
		return usage("%v", err)
	}
	stopProfile, err := startCPUProfile(e.v.GetString("cpuprofile"))
	if err != nil {
		return err
	}
	rep, err := bench.Run(ctx, cfg)
	if perr := stopProfile(); err == nil {
		err = perr
	}
	if perr := writeHeapProfile(e.v.GetString("memprofile")); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	return e.print(rep, func(w io.Writer) { printBench(w, rep) })
}

func benchConfig(e *env) (bench.Config, error) {
	cfg := bench.Config{PGURL: e.v.GetString("pg-url"), DBPrefix: e.v.GetString("db-prefix"),
		Stock: transfer.Units(e.v.GetInt64("stock")), ProbeOps: e.v.GetInt64("probe-ops"), Duration: e.v.GetDuration("duration"),
		Warmup: e.v.GetDuration("warmup"), WarmupOps: e.v.GetInt64("warmup-ops"), SQLConns: e.v.GetInt("sql-conns"),
		Seed: e.v.GetUint64("seed"), Rounds: e.v.GetInt("rounds"), RedisServer: e.v.GetString("redis-server")}
	gc, err := cliconf.GC(e.cmd, e.v)
	if err != nil {
		return cfg, usage("%v", err)
	}
	cfg.GC = gc
	cfg.Region = region.Config{Writer: region.WriterConfig{MaxBatch: e.v.GetInt("max-batch"), BatchWindow: e.v.GetDuration("batch-window")}}
	for _, s := range splitList(e.v.GetString("concurrency")) {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return cfg, usage("--concurrency: %q is not a positive number", s)
		}
		cfg.Concurrencies = append(cfg.Concurrencies, n)
	}
	if len(cfg.Concurrencies) == 0 || cfg.Stock <= 0 || cfg.ProbeOps < 0 || cfg.Duration <= 0 || cfg.WarmupOps < 0 || cfg.SQLConns < 0 || cfg.Rounds <= 0 {
		return cfg, usage("--concurrency, --stock, --duration and --rounds must be positive; --probe-ops, --warmup-ops and --sql-conns not negative")
	}
	cfg.Variants = splitList(e.v.GetString("variants"))
	if len(cfg.Variants) == 0 {
		return cfg, usage("--variants: name at least one of a,b,c,d,e,f,g,h,i,j")
	}
	for _, s := range splitList(e.v.GetString("buckets")) {
		k, err := strconv.Atoi(s)
		if err != nil {
			return cfg, usage("--buckets: %q is not a number", s)
		}
		cfg.Buckets = append(cfg.Buckets, k)
	}
	return cfg, nil
}

func roundsNote(n int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(", %d rounds", n)
}

// startCPUProfile profiles the process into path until the returned func is called; an empty
// path profiles nothing.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// writeHeapProfile writes the process's heap profile to path; an empty path writes nothing.
func writeHeapProfile(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("--memprofile: %w", err)
	}
	return f.Close()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func printBench(w io.Writer, rep *bench.Report) {
	s := rep.Setup
	fmt.Fprintf(w, "quotactl bench: concurrency %s, %d units per stock variant, %d calls for (e) and (f), cap %.0fs per variant, "+
		"warm-up %.1fs or %d ops, seed %d%s\n", joinInts(s.Concurrencies), s.StockPerVariant, s.ProbeOps, s.DurationCapSec, s.WarmupSec, s.WarmupOps, s.Seed,
		roundsNote(s.Rounds))
	pool := strconv.Itoa(s.SQLConns)
	if s.SQLConnsPerRun {
		pool = "min(callers, 64)"
	}
	pg := fmt.Sprintf("PostgreSQL %s (synchronous_commit %s)", s.PostgreSQL, s.SynchronousCommit)
	if s.PostgreSQL == "" {
		pg = "PostgreSQL not used"
	}
	fmt.Fprintf(w, "%s; %s, GOMAXPROCS %d, %d CPUs, %s; SQL pool %s connections\n", pg, s.GoVersion, s.GOMAXPROCS, s.NumCPU, s.GC, pool)
	fmt.Fprintf(w, "region: %s\n", s.Region)
	if s.RedisServer != "" {
		fmt.Fprintf(w, "redis: %s, appendonly yes, save \"\"\n", s.RedisServer)
	}
	fmt.Fprintf(w, "placement: %s\n", s.Placement)
	fmt.Fprintf(w, "load average before %s, after %s\n\n", s.LoadAvgStart, s.LoadAvgEnd)
	fmt.Fprintf(w, "%-12s %-57s %9s %9s %8s %8s %8s %7s %8s %6s %7s %8s %6s %10s  %s\n", "", "variant", "res/s", "ops/s", "p50 ms", "p99 ms",
		"p99.9 ms", "sold", "oversell", "errors", "secs", "cpu µs/op", "busy%", "mach µs/op", "check")
	sweep := len(s.Concurrencies) > 1
	for i, v := range rep.Variants {
		name := v.Variant
		if sweep {
			name = fmt.Sprintf("%s@%d", name, v.Concurrency)
		}
		if s.Rounds > 1 {
			name = fmt.Sprintf("%s/%d", name, v.Round)
		}
		if i > 0 && (v.Round != rep.Variants[i-1].Round || v.Concurrency != rep.Variants[i-1].Concurrency) {
			fmt.Fprintln(w)
		}
		if v.Skipped != "" {
			fmt.Fprintf(w, "%-12s %-57s skipped: %s\n", name, v.Label, v.Skipped)
			continue
		}
		fmt.Fprintf(w, "%-12s %-57s %9.0f %9.0f %8.2f %8.2f %8.2f %7d %8d %6d %7.2f %9.1f %6.1f %10.1f  %s\n", name, v.Label, v.ReservationsPerSec,
			v.OpsPerSec, v.Latency.P50, v.Latency.P99, v.Latency.P999, v.Sold, v.Oversell, v.Errors, v.MeasuredSec, v.ProcessCPUPerOp,
			v.MachineBusyPct, v.MachineCPUPerOp, v.Check)
		if v.ServerCPUPerOp > 0 {
			fmt.Fprintf(w, "     redis-server: %.1f µs of CPU per take (the client's is the cpu column)\n", v.ServerCPUPerOp)
		}
		if v.FirstError != "" {
			fmt.Fprintf(w, "     first error: %s\n", v.FirstError)
		}
	}
	if rep.BestBuckets > 0 {
		fmt.Fprintf(w, "\nbest K of (c): %d\n", rep.BestBuckets)
	}
	printRatios(w, rep)
	if hint := peakHint(rep); hint != "" {
		fmt.Fprintf(w, "\n%s\n", hint)
	}
	if b := rep.Binding; b != nil {
		fmt.Fprintf(w, "\nbinding each new buyer in etcd at their first reservation, (d) beside (j) at %d callers: %.0f against %.0f reservations/s (d/j %.3f),\n"+
			"  p99 %.2f against %.2f ms, %.1f against %.1f µs of this process's CPU per reservation\n",
			b.Concurrency, b.PerSecD, b.PerSecJ, b.Ratio, b.P99D, b.P99J, b.ProcessCPUPerOpD, b.ProcessCPUPerOpJ)
	}
	if b := rep.Budget; b != nil {
		fmt.Fprintf(w, "\n(d)/(e) ≈ utilization × cost = %.3f × %.3f: the machine was %.1f %% busy during (d), %.1f %% during (e);\n"+
			"  a reservation cost it %.1f µs of CPU (this process %.1f, the rest PostgreSQL and the kernel), a no-op call %.1f (this process %.1f)\n",
			b.Utilization, b.Cost, b.BusyPctD, b.BusyPctE, b.MachineCPUPerOpD, b.ProcessCPUPerOpD, b.MachineCPUPerOpE, b.ProcessCPUPerOpE)
	}
}

// printRatios prints the ratios against their targets and, in a sweep, at each concurrency.
func printRatios(w io.Writer, rep *bench.Report) {
	if len(rep.Ratios) > 0 {
		fmt.Fprintf(w, "\nratios against their targets%s:\n", peakNote(rep))
		if rep.Setup.Rounds > 1 {
			fmt.Fprintf(w, "  (over each variant's median of %d rounds: res/s, ops/s, p99)\n", rep.Setup.Rounds)
		}
	}
	for _, r := range rep.Ratios {
		cmp := "≥"
		if r.AtMost {
			cmp = "≤"
		}
		fmt.Fprintf(w, "  %-12s %8.3f   target %s %-5g %-8s %s\n", r.Name, r.Value, cmp, r.Target, verdictOf(r), r.Meaning)
	}
	for i, at := range rep.AtConcurrency {
		if i == 0 {
			fmt.Fprintln(w, "\nthe ratios at each concurrency:")
		}
		fmt.Fprintf(w, "  %5d callers:", at.Concurrency)
		for _, r := range at.Ratios {
			fmt.Fprintf(w, "  %s %.3f (%s)", r.Name, r.Value, verdictOf(r))
		}
		fmt.Fprintln(w)
	}
}

// verdictOf says whether a ratio met its target.
func verdictOf(r bench.Ratio) string {
	if r.Met {
		return "met"
	}
	return "NOT met"
}

// joinInts prints ns as a list: 64,256,1024.
func joinInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

// peakNote says, in a sweep, at which concurrency the ratios are taken.
func peakNote(rep *bench.Report) string {
	n := rep.PeakConcurrency
	if n == 0 {
		return ""
	}
	for _, v := range rep.Variants {
		if v.Variant == bench.VariantRegion {
			return fmt.Sprintf(" at %d callers, where (d) peaked", n)
		}
	}
	return fmt.Sprintf(" at %d callers", n)
}

// peakHint points a run at one concurrency whose (d) missed a target to the sweep: the
// targets are taken where (d) peaks, and a closed loop of few callers, each waiting
// for its commit, leaves the machine idle.
func peakHint(rep *bench.Report) string {
	if len(rep.Setup.Concurrencies) != 1 || rep.Setup.Concurrencies[0] > 2500 {
		return ""
	}
	for _, r := range rep.Ratios {
		if !r.Met && (strings.HasPrefix(r.Name, "d/") || strings.HasPrefix(r.Name, "p99_d")) {
			n := rep.Setup.Concurrencies[0]
			return fmt.Sprintf("(d) may not be at its peak at %d callers: the targets are taken where it peaks; find it with\n"+
				"  quotactl bench --variants d,e,f --stock 100000 --probe-ops 300000 --concurrency %d,%d,%d --rounds 3",
				n, n, 4*n, min(16*n, 10_000))
		}
	}
	return ""
}
