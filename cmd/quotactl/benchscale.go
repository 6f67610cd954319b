package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/cmd/quotactl/internal/bench"
	"github.com/quotaworks/quota/coordinator"
	"github.com/spf13/cobra"
)

func benchScaleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Measure how the system's costs grow with pools, sales, stored holds and transfers",
		Long: `bench scale measures growth curves, each point measured, one curve after another in one run:
  pools        a region's durable reservations/s and p99 with --pools pools live in it (sales of up
               to 10 SKUs, all their stock in the region; once their creation settles, for as
               long as it took, at most 15 s): --pool-ops reservations from --concurrency
               callers on one pool (hot), then as many spread round-robin over every pool
               (spread)
  coordinator  with --sales idle sales (--idle-skus SKUs each, over three regions; watched
               35 s after the last is created, past a new sale's first 30 s open, or with an
               --idle-window under 10 s as long as the window), the
               transactions per second each region database and the ledger commit
               (pg_stat_database xact_commit + xact_rollback deltas over --idle-window), this
               process's CPU and the coordinator's share of it (COORD%, from a CPU profile of
               the window by component), and how long the continuous audit's last round took
               (AUDIT MS); once with the rebalancer off and manual sales (the sold-out loop
               alone), once with it on and auto sales (both loops); a point with no sale first
  takeover     a region database with --takeover-live held holds of a running sale and
               --closed-holds archived closed holds of an earlier sale (holds_closed, as the
               archiver leaves them): --takeover-runs cold takeovers (every hold in the holds
               table read; the median), each just after one of a database with the same live
               holds and no history (the ratio of the two medians), and a warm standby's (its
               copy caught up) after the old leader made --live-ops reservations
  audit        the coordinator's Audit of one sale over three regions with --transfers transfers,
               then with --audit-holds sold holds stored in its pools (the median of --audit-runs)
Each curve runs on an in-process cluster (embedded etcd, plaintext gRPC) or a database of its
own, created and dropped by the run, also after an error or an interrupt. Holds of the takeover
and audit curves are written straight into the regions' tables, with the pools' counts moved to
match. Every point must run cleanly (every reservation granted, every transfer posted, every
audit clean) or the run fails. Figures and the capacity model: docs/scaling.md.`,
		Example: `  quotactl bench scale
  quotactl bench scale --curves pools --pools 1,10,100,1000,5000 --pool-ops 50000
  quotactl bench scale --curves takeover,audit --closed-holds 10000,100000,1000000 --audit-holds 10000,100000,1000000 -o json
  quotactl bench scale --curves takeover --takeover-live 1000000 --closed-holds 0,10000000 --takeover-runs 3`,
		Args: cobra.NoArgs,
		RunE: withEnv(runBenchScale),
	}
	f := cmd.Flags()
	f.String("curves", strings.Join(bench.ScaleCurves, ","), "curves to run, of "+strings.Join(bench.ScaleCurves, ","))
	f.String("pools", "1,10,100,1000", "pools curve: pools live in the region at each point")
	f.Int64("pool-ops", 40000, "pools curve: reservations of each load at each point")
	f.String("concurrency", "256", "pools curve: callers in flight at once")
	f.String("sales", "1,10,100,1000", "coordinator curve: idle sales at each point")
	f.Int("idle-skus", 10, "coordinator curve: SKUs of each idle sale")
	f.Duration("idle-window", 5*time.Second, "coordinator curve: how long each point is watched")
	f.Duration("audit-interval", coordinator.DefaultAuditInterval, "coordinator curve: the coordinator's continuous audit, as quotad's --audit-interval (0: none)")
	f.String("closed-holds", "0,100000,1000000", "takeover curve: archived closed holds stored at each point")
	f.Int64("takeover-live", 100000, "takeover curve: held holds stored before the first point")
	f.Int("takeover-runs", 1, "takeover curve: cold takeovers timed at each point (the median is reported)")
	f.Int("live-ops", 1000, "takeover curve: reservations the old leader makes before the warm standby takes over")
	f.String("transfers", "100,1000", "audit curve: the sale's transfers at each point")
	f.String("audit-holds", "10000,100000,1000000", "audit curve: holds stored over the sale's three regions at each point (after every transfer)")
	f.Int("transfers-in-flight", 64, "audit curve: transfers asked of the coordinator at once")
	f.Int("transfers-via-coordinator", 1000, "audit curve: transfers made through the coordinator; the rest are stored as copies of them, records and pools' counts alike")
	f.Int("audit-runs", 3, "audit curve: audits timed at each point (the median is reported)")
	f.Duration("duration", time.Minute, "cap on each point's reservation load")
	f.Duration("curve-timeout", 15*time.Minute, "cap on each curve")
	f.String("pg-url", "postgres://quota:quota@127.0.0.1:5432/postgres", "URL of the PostgreSQL server on which to create (and drop) the bench's databases (--db-prefix); its own database is only connected to")
	f.String("db-prefix", "", "prefix of the databases the bench creates and drops; default quota_bench_sc_<pid>_<n>")
	cliconf.AddGCFlags(f)
	return cmd
}

func runBenchScale(e *env) error {
	cfg, err := benchScaleConfig(e)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return usage("%v", err)
	}
	cfg.Progress = func(msg string) { fmt.Fprintf(os.Stderr, "bench scale: %s %s\n", time.Now().Format("15:04:05"), msg) }
	// Not e.ctx: --timeout bounds one call, and the bench runs for minutes. An interrupt
	// stops it and still drops its databases.
	ctx, stop := signal.NotifyContext(e.cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.RunScale(ctx, cfg)
	if err != nil {
		return fmt.Errorf("bench scale: %w", err)
	}
	return e.print(rep, func(w io.Writer) { printScale(w, rep) })
}

func benchScaleConfig(e *env) (bench.ScaleConfig, error) {
	cfg := bench.ScaleConfig{PGURL: e.v.GetString("pg-url"), DBPrefix: e.v.GetString("db-prefix"), Curves: splitList(e.v.GetString("curves")),
		PoolOps: e.v.GetInt64("pool-ops"), IdleWindow: e.v.GetDuration("idle-window"), IdleSKUs: e.v.GetInt("idle-skus"),
		AuditInterval: e.v.GetDuration("audit-interval"), LiveOps: e.v.GetInt("live-ops"),
		TakeoverLive: e.v.GetInt64("takeover-live"), TakeoverRuns: e.v.GetInt("takeover-runs"),
		AuditRuns: e.v.GetInt("audit-runs"), TransfersInFlight: e.v.GetInt("transfers-in-flight"),
		TransfersViaCoordinator: e.v.GetInt("transfers-via-coordinator"), Duration: e.v.GetDuration("duration"), CurveTimeout: e.v.GetDuration("curve-timeout")}
	gc, err := cliconf.GC(e.cmd, e.v)
	if err != nil {
		return cfg, usage("%v", err)
	}
	cfg.GC = gc
	if cfg.Concurrency, err = strconv.Atoi(e.v.GetString("concurrency")); err != nil {
		return cfg, usage("--concurrency %q: want one number", e.v.GetString("concurrency"))
	}
	ints := map[string]*[]int{"pools": &cfg.Pools, "sales": &cfg.Sales, "transfers": &cfg.Transfers}
	for flag, dst := range ints {
		for _, s := range splitList(e.v.GetString(flag)) {
			n, err := strconv.Atoi(s)
			if err != nil {
				return cfg, usage("--%s: %q is not a number", flag, s)
			}
			*dst = append(*dst, n)
		}
	}
	for flag, dst := range map[string]*[]int64{"closed-holds": &cfg.ClosedHolds, "audit-holds": &cfg.AuditHolds} {
		for _, s := range splitList(e.v.GetString(flag)) {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return cfg, usage("--%s: %q is not a number", flag, s)
			}
			*dst = append(*dst, n)
		}
	}
	return cfg, nil
}

func printScale(w io.Writer, rep *bench.ScaleReport) {
	s := rep.Setup
	fmt.Fprintf(w, "%d CPUs, GOMAXPROCS %d, %s, GC %s, PostgreSQL %s; load average %s before, %s after\n%s\n",
		s.CPUs, s.GOMAXPROCS, s.GoVersion, s.GC, s.Postgres, s.LoadAvgStart, s.LoadAvgEnd, s.Placement)
	if len(rep.Pools) > 0 {
		fmt.Fprintf(w, "\nPOOLS: reservations on one pool (hot) or spread over every pool of one region\n%7s %6s %-7s %8s %10s %9s %9s %9s %7s %9s\n",
			"POOLS", "SALES", "LOAD", "CALLERS", "RES/S", "P50 MS", "P99 MS", "CPU µs", "BUSY%", "MACH µs")
		for _, p := range rep.Pools {
			fmt.Fprintf(w, "%7d %6d %-7s %8d %10.0f %9.2f %9.2f %9.1f %7.1f %9.1f\n", p.Pools, p.Sales, p.Load, p.Concurrency, p.ReservationsPerSec,
				p.P50Ms, p.P99Ms, p.ProcessCPUPerOp, p.MachineBusyPct, p.MachineCPUPerOp)
		}
	}
	if len(rep.Coordinator) > 0 {
		p := rep.Coordinator[0]
		fmt.Fprintf(w, "\nCOORDINATOR: idle sales of %d SKUs, continuous audit every %gs (0: none), transactions/s at each region database (pg_stat_database)\n%-28s %6s %9s %9s %9s %9s %9s %7s %7s %7s %9s\n",
			p.SKUs, p.AuditEverySec, "MODE", "SALES", "US TX/S", "EU TX/S", "AP TX/S", "PER SALE", "LEDGER", "COORD%", "CPU%", "BUSY%", "AUDIT MS")
		for _, p := range rep.Coordinator {
			fmt.Fprintf(w, "%-28s %6d %9.1f %9.1f %9.1f %9.3f %9.1f %7.1f %7.1f %7.1f %9.1f\n", p.Mode, p.Sales, p.TxPerSec["us"], p.TxPerSec["eu"],
				p.TxPerSec["ap"], p.PerSalePerSec, p.LedgerTxPerSec, p.CoordinatorCPUPct, p.ProcessCPUPct, p.MachineBusyPct, p.AuditMs)
		}
	}
	printScaleHistory(w, rep)
}

func printScaleHistory(w io.Writer, rep *bench.ScaleReport) {
	if len(rep.Takeover) > 0 {
		fmt.Fprintf(w, "\nTAKEOVER: a region database with archived closed holds of an earlier sale, against one without\n%10s %10s %10s %9s %9s %7s %9s %9s %9s %5s  %s\n",
			"ARCHIVED", "HOLDS ROWS", "LIVE", "COLD MS", "BASE MS", "×BASE", "HEAP MiB", "BASE MiB", "WARM MS", "WARM", "COLD RUNS / BASE RUNS")
		for _, p := range rep.Takeover {
			fmt.Fprintf(w, "%10d %10d %10d %9.1f %9.1f %7.2f %9.1f %9.1f %9.1f %5v  %v / %v\n", p.ArchivedRows, p.HoldRows, p.LiveHolds, p.ColdMs,
				p.BaselineMs, p.ColdVsBaseline, p.HeapMiB, p.BaselineHeapMiB, p.WarmMs, p.Warm, p.ColdRuns, p.BaselineRuns)
		}
	}
	if len(rep.Audit) > 0 {
		fmt.Fprintf(w, "\nAUDIT: one sale over three regions\n%10s %10s %10s %s\n", "TRANSFERS", "HOLDS", "MS", "RUNS MS")
		for _, p := range rep.Audit {
			fmt.Fprintf(w, "%10d %10d %10.1f %v\n", p.Transfers, p.Holds, p.Ms, p.Runs)
		}
	}
}
