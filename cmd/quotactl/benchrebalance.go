package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/cmd/quotactl/internal/bench"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
)

func benchRebalanceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rebalance",
		Short: "Run one skewed sale three ways: no rebalancing, one operator rebalance, the automatic rebalancer",
		Long: `bench rebalance starts an in-process cluster of three regions (us, eu, ap) on PostgreSQL and
runs the same sale on it three times, one after another: the stock split by --allocation, the
buyers by --demand, each buyer asking one unit at its region and paying at once.
  none      the allocation stays where it was put
  operator  one quotactl rebalance (window 1m, horizon 1m, min 10) --operator-after into the sale
  auto      the coordinator's automatic rebalancer (the --rebalance-* settings)
For each it prints the time to sell out, the sell-through, the buyers told REGION_EXHAUSTED,
and of those the buyers told so while another region had at least one unit available at that
moment (undersold), from the regions' own records: each region's available units over time are
rebuilt from its credits, debits, restores and holds. The undersold are given as a share of
all buyers (OF ALL) and of the buyers not told SOLD_OUT (BEFORE SO: those who came while the
sale had units). Every database is dropped at the end.`,
		Example: `  quotactl bench rebalance
  quotactl bench rebalance --stock 10000 --demand 100,0,0 -o json`,
		Args: cobra.NoArgs,
		RunE: withEnv(runBenchRebalance),
	}
	f := cmd.Flags()
	f.Int64("stock", 10000, "the sale's units")
	f.String("allocation", "40,35,25", "the stock's split over us, eu, ap")
	f.String("demand", "70,20,10", "the buyers' split over us, eu, ap")
	f.Int("buyers", 0, "buyers, each asking one unit; default 2 × --stock")
	f.Float64("rate", 2000, "buyers arriving per second")
	f.String("concurrency", "256", "buyers in flight at once")
	f.Duration("operator-after", 2*time.Second, "when, into the sale, the operator's one rebalance runs")
	f.Duration("duration", 2*time.Minute, "cap on each sale's load")
	f.String("pg-url", "postgres://quota:quota@127.0.0.1:5432/postgres", "URL of the PostgreSQL server on which to create (and drop) the bench's databases (--db-prefix); its own database is only connected to")
	f.String("db-prefix", "", "prefix of the databases the bench creates and drops; default quota_bench_rb_<pid>_<n>")
	f.Uint64("seed", 1, "random seed (the buyers' regions)")
	f.Duration("rebalance-every", coordinator.DefaultRebalanceEvery, "the automatic rebalancer's interval")
	f.Duration("rebalance-window", coordinator.DefaultRebalanceWindow, "the automatic rebalancer's demand window")
	f.Duration("rebalance-horizon", coordinator.DefaultRebalanceHorizon, "the automatic rebalancer's horizon")
	f.Int64("rebalance-min-units", coordinator.DefaultRebalanceMinUnits, "the automatic rebalancer's smallest move")
	f.Duration("rebalance-cooldown", coordinator.DefaultRebalanceCooldown, "the automatic rebalancer's pause after moving a SKU")
	return cmd
}

func runBenchRebalance(e *env) error {
	alloc, err := shareList("allocation", e.v.GetString("allocation"))
	if err != nil {
		return err
	}
	demand, err := shareList("demand", e.v.GetString("demand"))
	if err != nil {
		return err
	}
	conc, err := strconv.Atoi(e.v.GetString("concurrency"))
	if err != nil {
		return usage("--concurrency %q: want a number", e.v.GetString("concurrency"))
	}
	cfg := bench.RebalanceConfig{PGURL: e.v.GetString("pg-url"), DBPrefix: e.v.GetString("db-prefix"),
		Stock: transfer.Units(e.v.GetInt64("stock")), Allocation: alloc, Demand: demand, Buyers: e.v.GetInt("buyers"),
		Rate: e.v.GetFloat64("rate"), Concurrency: conc, OperatorAfter: e.v.GetDuration("operator-after"),
		Duration: e.v.GetDuration("duration"), Seed: e.v.GetUint64("seed"),
		Auto: coordinator.AutoRebalance{Every: e.v.GetDuration("rebalance-every"), Cooldown: e.v.GetDuration("rebalance-cooldown"), Policy: transfer.Policy{Window: e.v.GetDuration("rebalance-window"),
			Horizon: e.v.GetDuration("rebalance-horizon"), MinUnits: transfer.Units(e.v.GetInt64("rebalance-min-units"))}}}
	if err := cfg.Validate(); err != nil {
		return usage("%v", err)
	}
	// Not e.ctx: --timeout bounds one call, and the bench runs for minutes. An interrupt
	// stops it and still drops its databases.
	ctx, stop := signal.NotifyContext(e.cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rows, err := bench.RunRebalance(ctx, cfg)
	if err != nil {
		return fmt.Errorf("bench rebalance: %w", err)
	}
	return e.print(rows, func(w io.Writer) { printRebalanceRows(w, cfg, rows) })
}

// shareList parses "40,35,25".
func shareList(flag, s string) ([]int64, error) {
	var out []int64
	for _, item := range cliconf.SplitList(s) {
		n, err := strconv.ParseInt(item, 10, 64)
		if err != nil {
			return nil, usage("--%s %q: want numbers such as 40,35,25", flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func printRebalanceRows(w io.Writer, cfg bench.RebalanceConfig, rows []bench.RebalanceRow) {
	fmt.Fprintf(w, "%d units split %v over us, eu, ap; %d buyers split %v, %g/s, %d in flight\n",
		cfg.Stock, cfg.Allocation, cfg.Buyers, cfg.Demand, cfg.Rate, cfg.Concurrency)
	fmt.Fprintf(w, "%-9s %12s %12s %10s %10s %10s %9s %9s %6s %7s\n", "MODE", "SOLD OUT IN", "SELL-THRU", "BUYERS", "EXHAUSTED", "UNDERSOLD",
		"OF ALL", "BEFORE SO", "MOVES", "UNITS")
	for _, r := range rows {
		soldOut := "not sold out"
		if r.SoldOutAfter >= 0 {
			soldOut = r.SoldOutAfter.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(w, "%-9s %12s %11.2f%% %10d %10d %10d %8.3f%% %8.3f%% %6d %7d\n", r.Mode, soldOut, 100*r.SellThrough, r.Buyers,
			r.Exhausted, r.Undersold, 100*r.UndersellFraction, 100*r.UndersellOfUnsoldOut, r.Moves, r.MovedUnits)
	}
}
