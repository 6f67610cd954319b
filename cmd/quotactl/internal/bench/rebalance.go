package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The rebalance bench's three ways of running one sale, side by side.
const (
	ModeNone     = "none"     // the allocation stays where it was put
	ModeOperator = "operator" // one operator-triggered rebalance (quotactl rebalance) during the sale
	ModeAuto     = "auto"     // the coordinator's automatic rebalancer
)

// rebalanceRegions are the bench's three regions, in order.
var rebalanceRegions = []string{"us", "eu", "ap"}

// RebalanceConfig is one run of `quotactl bench rebalance`.
type RebalanceConfig struct {
	PGURL, DBPrefix string
	// Stock is the sale's units; Allocation and Demand are the regions' shares (us, eu, ap)
	// of the stock and of the buyers.
	Stock              transfer.Units
	Allocation, Demand []int64
	// Buyers arrive at Rate per second, Concurrency at once; each asks one unit and pays.
	Buyers      int
	Rate        float64
	Concurrency int
	// OperatorAfter is when, into the sale, the operator's one rebalance runs (ModeOperator),
	// with the CLI's default policy.
	OperatorAfter time.Duration
	// Auto is the coordinator's automatic rebalancer (ModeAuto's sale is in auto mode, the
	// others in manual).
	Auto     coordinator.AutoRebalance
	Duration time.Duration // cap on each mode's load
	Seed     uint64
	Logger   *slog.Logger
}

// RebalanceRow is one mode's result.
type RebalanceRow struct {
	Mode string `json:"mode"`
	// SoldOutAfter is the time from the sale's first buyer to its last unit sold; negative
	// when the sale did not sell out.
	SoldOutAfter time.Duration `json:"sold_out_after_ns"`
	Sold         int64         `json:"sold"`
	Stock        int64         `json:"stock"`
	SellThrough  float64       `json:"sell_through"`
	Buyers       int64         `json:"buyers"`
	Exhausted    int64         `json:"region_exhausted"`
	// Undersold counts the buyers told REGION_EXHAUSTED while another region had at least one
	// unit available at that moment, by the regions' own records; UndersellFraction is their
	// share of all buyers.
	Undersold         int64   `json:"undersold"`
	UndersellFraction float64 `json:"undersell_fraction"`
	// UndersellOfUnsoldOut is Undersold over the buyers not told SOLD_OUT (those who came
	// while the sale still had units): the stricter reading.
	UndersellOfUnsoldOut float64 `json:"undersell_of_buyers_before_sell_out"`
	// Moves is the transfers between regions and the units they moved.
	Moves      int   `json:"moves"`
	MovedUnits int64 `json:"moved_units"`
}

// RunRebalance runs the same skewed sale three times on one in-process cluster of three
// regions: with no rebalancing, with one operator rebalance, with the automatic rebalancer.
func RunRebalance(ctx context.Context, cfg RebalanceConfig) (rows []RebalanceRow, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	dbs := &databases{admin: cfg.PGURL}
	defer func() { err = errors.Join(err, dbs.dropAll()) }()
	for _, role := range append([]string{"coordinator"}, rebalanceRegions...) {
		dbs.track(cluster.DBName(cfg.DBPrefix, role))
	}
	dir, err := os.MkdirTemp("", "quota-bench-rebalance-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	auto := cfg.Auto
	auto.Enabled = true
	dev, err := cluster.StartDev(ctx, cluster.DevConfig{Regions: rebalanceRegions, PGURL: cfg.PGURL, DBPrefix: cfg.DBPrefix,
		DataDir: dir, Host: "127.0.0.1", LeaseTTL: 10 * time.Second, Logger: cfg.Logger, Auto: auto, Insecure: true})
	if err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	defer dev.Close()
	conn, err := grpc.NewClient(dev.Coordinator.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	coord := quotav1.NewCoordinatorServiceClient(conn)
	for _, mode := range []string{ModeNone, ModeOperator, ModeAuto} {
		row, err := runMode(ctx, cfg, dev, coord, mode)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", mode, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// runMode creates the mode's sale, allocates it, runs the buyers and measures.
func runMode(ctx context.Context, cfg RebalanceConfig, dev *cluster.Dev, coord quotav1.CoordinatorServiceClient, mode string) (RebalanceRow, error) {
	sale := "rebalance-" + mode
	if err := createSkewedSale(ctx, coord, cfg, sale, mode); err != nil {
		return RebalanceRow{}, err
	}
	var regions []loadgen.Region
	for i, r := range dev.Regions {
		regions = append(regions, loadgen.Region{Name: rebalanceRegions[i], Addr: r.Addr(), Weight: cfg.Demand[i]})
	}
	var mu sync.Mutex
	var refusals []refusal
	var soldOutAt time.Time
	began := time.Now()
	lg := loadgen.Config{Creds: insecure.NewCredentials(), Sale: sale, SKU: benchSKU, Regions: regions, Buyers: cfg.Buyers,
		Concurrency: cfg.Concurrency, Rate: cfg.Rate, ConfirmRatio: 1, MaxDuration: cfg.Duration, Seed: cfg.Seed, UserPrefix: mode + "-",
		OnExhausted: func(region string, at time.Time) {
			mu.Lock()
			refusals = append(refusals, refusal{region, at})
			mu.Unlock()
		},
		ProgressEvery: 50 * time.Millisecond, Progress: func(s loadgen.Stats) {
			if soldOutAt.IsZero() && s.UnitsGranted >= int64(cfg.Stock) {
				soldOutAt = time.Now()
			}
		}}
	stopOperator := operatorRebalance(ctx, coord, cfg, sale, mode)
	st, err := loadgen.Run(ctx, lg)
	stopOperator()
	if err != nil {
		return RebalanceRow{}, err
	}
	if st.UnitsGranted >= int64(cfg.Stock) && soldOutAt.IsZero() {
		soldOutAt = began.Add(st.Elapsed)
	}
	return measure(ctx, dev, coord, cfg, sale, mode, st, refusals, began, soldOutAt)
}

// refusal is one REGION_EXHAUSTED answer: where and when.
type refusal struct {
	region string
	at     time.Time
}

// createSkewedSale creates sale with the bench's stock and allocates it by cfg.Allocation.
func createSkewedSale(ctx context.Context, coord quotav1.CoordinatorServiceClient, cfg RebalanceConfig, sale, mode string) error {
	rebalance := string(coordinator.RebalanceManual)
	if mode == ModeAuto {
		rebalance = string(coordinator.RebalanceAuto)
	}
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, PerUserLimit: 1, HoldTtlMs: time.Hour.Milliseconds(),
		Skus: []*quotav1.SkuTotal{{Sku: benchSKU, Total: int64(cfg.Stock)}}, Rebalance: rebalance}); err != nil {
		return fmt.Errorf("create sale: %w", err)
	}
	var weights []*quotav1.RegionWeight
	for i, r := range rebalanceRegions {
		weights = append(weights, &quotav1.RegionWeight{Region: r, Weight: cfg.Allocation[i]})
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale, Weights: weights}); err != nil {
		return fmt.Errorf("allocate: %w", err)
	}
	return nil
}

// operatorRebalance runs, in ModeOperator, one `quotactl rebalance` (its default policy)
// OperatorAfter into the sale; the returned function waits for it.
func operatorRebalance(ctx context.Context, coord quotav1.CoordinatorServiceClient, cfg RebalanceConfig, sale, mode string) func() {
	if mode != ModeOperator {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.OperatorAfter):
		}
		if _, err := coord.Rebalance(ctx, &quotav1.RebalanceRequest{SaleId: sale, Sku: benchSKU, WindowMs: time.Minute.Milliseconds(),
			HorizonMs: time.Minute.Milliseconds(), MinUnits: 10, RequestId: "operator-" + sale}); err != nil {
			cfg.Logger.Warn("the operator's rebalance failed", "sale", sale, "err", err)
		}
	}()
	return func() { cancel(); <-done }
}

// measure reads what the regions recorded of the sale and scores the mode.
func measure(ctx context.Context, dev *cluster.Dev, coord quotav1.CoordinatorServiceClient, cfg RebalanceConfig, sale, mode string,
	st loadgen.Stats, refusals []refusal, began, soldOutAt time.Time) (RebalanceRow, error) {
	row := RebalanceRow{Mode: mode, Stock: int64(cfg.Stock), Buyers: st.Buyers, Exhausted: st.Exhausted, SoldOutAfter: -1}
	if !soldOutAt.IsZero() {
		row.SoldOutAfter = soldOutAt.Sub(began)
	}
	timelines := map[string]timeline{}
	for i, r := range dev.Regions {
		tl, sold, err := readTimeline(ctx, r.DB, sale, benchSKU)
		if err != nil {
			return row, fmt.Errorf("read region %s: %w", rebalanceRegions[i], err)
		}
		timelines[rebalanceRegions[i]] = tl
		row.Sold += sold
	}
	for _, f := range refusals {
		for name, tl := range timelines {
			if name != f.region && tl.at(f.at) > 0 {
				row.Undersold++
				break
			}
		}
	}
	ts, err := coord.ListTransfers(ctx, &quotav1.ListTransfersRequest{SaleId: sale})
	if err != nil {
		return row, err
	}
	for _, t := range ts.GetTransfers() {
		if t.GetFrom() != transfer.Unallocated && t.GetState() == "posted" {
			row.Moves++
			row.MovedUnits += t.GetUnits()
		}
	}
	row.SellThrough = float64(row.Sold) / float64(row.Stock)
	if row.Buyers > 0 {
		row.UndersellFraction = float64(row.Undersold) / float64(row.Buyers)
	}
	if before := st.Buyers - st.SoldOut; before > 0 {
		row.UndersellOfUnsoldOut = float64(row.Undersold) / float64(before)
	}
	return row, nil
}

// timeline is a region's available units of one SKU over time: after each change, in time
// order, the units then available.
type timeline []change

// change is one change of a pool's available units, and the units available after it.
type change struct {
	at    time.Time
	delta int64
	after int64
}

// at is the available units at t.
func (tl timeline) at(t time.Time) int64 {
	i := sort.Search(len(tl), func(i int) bool { return tl[i].at.After(t) })
	if i == 0 {
		return 0
	}
	return tl[i-1].after
}

// readTimeline rebuilds a region's available units of sale over time from its own durable
// records: credits in, debits out and their restores, holds taken and holds that came back
// (released or expired). It also answers the units sold there.
func readTimeline(ctx context.Context, db *pgxpool.Pool, sale, sku string) (timeline, int64, error) {
	rows, err := db.Query(ctx, `
		SELECT recorded_at, units FROM transfers_in WHERE sale_id = $1 AND sku = $2 AND state = 'credited'
		UNION ALL SELECT recorded_at, -units FROM transfers_out WHERE sale_id = $1 AND sku = $2 AND state IN ('pending', 'settled', 'voided')
		UNION ALL SELECT updated_at, units FROM transfers_out WHERE sale_id = $1 AND sku = $2 AND state = 'voided'
		UNION ALL SELECT created_at, -quantity FROM holds WHERE sale_id = $1 AND sku = $2
		UNION ALL SELECT closed_at, quantity FROM holds WHERE sale_id = $1 AND sku = $2 AND state IN ('released', 'expired')`, sale, sku)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var tl timeline
	for rows.Next() {
		var c change
		if err := rows.Scan(&c.at, &c.delta); err != nil {
			return nil, 0, err
		}
		tl = append(tl, c)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	sort.SliceStable(tl, func(i, j int) bool { return tl[i].at.Before(tl[j].at) })
	var n int64
	for i := range tl {
		n += tl[i].delta
		tl[i].after = n
	}
	var sold int64
	err = db.QueryRow(ctx, `SELECT coalesce(sum(sold), 0) FROM pools WHERE sale_id = $1 AND sku = $2`, sale, sku).Scan(&sold)
	return tl, sold, err
}

// Validate checks the configuration, naming the bad setting by its flag, and fills in the
// defaults.
func (c *RebalanceConfig) Validate() error {
	if c.DBPrefix == "" {
		c.DBPrefix = fmt.Sprintf("quota_bench_rb_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	}
	if c.Buyers == 0 {
		c.Buyers = int(2 * c.Stock)
	}
	shares := func(flag string, s []int64) error {
		if len(s) != len(rebalanceRegions) {
			return fmt.Errorf("--%s: want %d shares (us, eu, ap), got %d", flag, len(rebalanceRegions), len(s))
		}
		var sum int64
		for _, x := range s {
			if x < 0 {
				return fmt.Errorf("--%s: shares must not be negative", flag)
			}
			sum += x
		}
		if sum == 0 {
			return fmt.Errorf("--%s: the shares sum to zero", flag)
		}
		return nil
	}
	switch {
	case c.PGURL == "":
		return errors.New("--pg-url: must be set")
	case c.Stock < 3 || c.Stock > 10_000_000:
		return fmt.Errorf("--stock %d: must be 3..10000000", c.Stock)
	case c.Buyers < 1 || c.Buyers > 10_000_000:
		return fmt.Errorf("--buyers %d: must be 1..10000000", c.Buyers)
	case c.Rate <= 0 || c.Concurrency < 1 || c.Concurrency > 10_000:
		return fmt.Errorf("--rate %g, --concurrency %d: the rate must be positive, the concurrency 1..10000", c.Rate, c.Concurrency)
	case c.OperatorAfter < 0 || c.Duration <= 0:
		return fmt.Errorf("--operator-after %s, --duration %s: must not be negative, and the duration positive", c.OperatorAfter, c.Duration)
	}
	if err := shares("allocation", c.Allocation); err != nil {
		return err
	}
	return shares("demand", c.Demand)
}
