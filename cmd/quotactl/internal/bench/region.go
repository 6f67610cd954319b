package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The sale the region variants sell: one SKU, its stock all in one region (plus one unit
// left unallocated, see createSale).
const (
	benchRegion = "us"
	benchSale   = "bench"
	benchSKU    = "item"
)

// rig is the in-process cluster of the region variants and one client connection to its
// region.
type rig struct {
	dev     *cluster.Dev
	dataDir string
	conn    *grpc.ClientConn
	region  quotav1.RegionServiceClient
	health  healthpb.HealthClient
	db      *pgxpool.Pool // the region's own database
}

// rigKind is which region a rig runs: the product's, or one left without a part whose cost
// a variant measures.
type rigKind int

const (
	rigFull    rigKind = iota // (d)–(f)
	rigBare                   // (i): no metrics
	rigUnbound                // (j): no binding at a buyer's first reservation
)

// dbInfix is the part of the rig's database names after the run's prefix.
func (k rigKind) dbInfix() string {
	return [...]string{"_cl", "_cb", "_cu"}[k]
}

// runRegion starts the cluster, creates the sale, and runs (d), (e) and (f) as asked. (f)
// needs the pool empty, so the reservations of (d) run (unreported) even when only (f) is
// asked for.
func runRegion(ctx context.Context, cfg *Config, dbs *databases) ([]VariantResult, error) {
	cfg.progress("starting the in-process cluster (etcd, coordinator, region %s)", benchRegion)
	g, err := startRig(ctx, cfg, dbs, rigFull)
	if err != nil {
		return nil, err
	}
	defer g.close()
	var out []VariantResult
	if cfg.wants(VariantRegion, VariantSoldOut) {
		d, err := g.runReserve(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if cfg.wants(VariantRegion) {
			cfg.progress("%s", d.oneLine())
			out = append(out, d)
		}
	}
	if cfg.wants(VariantNoop) {
		cfg.progress("(e) running")
		e := cfg.probeLoad(func(int) attempt { return g.healthCheck }).run(ctx)
		e.Variant, e.Label, e.Check = VariantNoop, "gRPC health check on the region server (no-op)", "ok"
		cfg.progress("%s", e.oneLine())
		out = append(out, e)
	}
	if cfg.wants(VariantSoldOut) {
		f, err := g.runSoldOut(ctx, cfg)
		if err != nil {
			return nil, err
		}
		cfg.progress("%s", f.oneLine())
		out = append(out, f)
	}
	return out, nil
}

// runAgain runs (d) again on a cluster of its own, as variant: (i), whose region counts
// nothing for Prometheus and whose gRPC server has no metrics interceptors (the cost of the
// metrics), or (j), whose region binds no buyer at their first reservation (the cost of
// that binding's etcd write).
func runAgain(ctx context.Context, cfg *Config, dbs *databases, variant string) (VariantResult, error) {
	kind, label, without := rigBare, "region Reserve over gRPC, without metrics", "metrics"
	if variant == VariantRegionUnbound {
		kind, label, without = rigUnbound, "region Reserve over gRPC, no binding at first reservation", "binding buyers"
	}
	cfg.progress("starting the in-process cluster without %s", without)
	g, err := startRig(ctx, cfg, dbs, kind)
	if err != nil {
		return VariantResult{}, err
	}
	defer g.close()
	res, err := g.runReserve(ctx, cfg)
	res.Variant, res.Label = variant, label
	return res, err
}

// startRig starts an all-in-one cluster with one region of kind on free ports, creates the
// sale with cfg.Stock units in that region, and connects a client.
func startRig(ctx context.Context, cfg *Config, dbs *databases, kind rigKind) (g *rig, err error) {
	g = &rig{}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if g.dataDir, err = os.MkdirTemp("", "quota-bench-"); err != nil {
		return nil, err
	}
	prefix := cfg.DBPrefix + kind.dbInfix()
	for _, role := range []string{"coordinator", benchRegion} {
		name := cluster.DBName(prefix, role)
		dbs.track(name)
		if err := pgutil.DropDatabase(ctx, cfg.PGURL, name); err != nil { // a leftover of an interrupted run
			return nil, err
		}
	}
	g.dev, err = cluster.StartDev(ctx, cluster.DevConfig{Regions: []string{benchRegion}, PGURL: cfg.PGURL, DBPrefix: prefix,
		DataDir: g.dataDir, Host: "127.0.0.1", LeaseTTL: 10 * time.Second, Logger: cfg.Logger, Region: cfg.Region, NoMetrics: kind == rigBare,
		NoBindAtReserve: kind == rigUnbound,
		// The bench's private cluster on loopback runs plaintext gRPC, so its figures are
		// comparable with those recorded before the servers served TLS.
		Insecure: true})
	if err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	g.db = g.dev.Regions[0].DB
	if err := createSale(ctx, g.dev.Coordinator.Addr(), cfg.Stock); err != nil {
		return nil, err
	}
	if g.conn, err = grpc.NewClient(g.dev.Regions[0].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	g.region, g.health = quotav1.NewRegionServiceClient(g.conn), healthpb.NewHealthClient(g.conn)
	if _, err := g.health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil { // connect before measuring
		return nil, fmt.Errorf("region health check: %w", err)
	}
	return g, nil
}

// createSale creates the bench sale (limit 1 per user, holds that outlive the run) with
// stock + 1 units and moves stock of them to the bench region, as a transfer from the
// unallocated pool. The one unit left unallocated keeps the SKU from being sold out
// everywhere, so an empty region answers REGION_EXHAUSTED (not SOLD_OUT) in (f).
func createSale(ctx context.Context, coordAddr string, stock transfer.Units) error {
	conn, err := grpc.NewClient(coordAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	c := quotav1.NewCoordinatorServiceClient(conn)
	if _, err := c.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: benchSale, PerUserLimit: 1, HoldTtlMs: time.Hour.Milliseconds(),
		Skus: []*quotav1.SkuTotal{{Sku: benchSKU, Total: int64(stock) + 1}}}); err != nil {
		return fmt.Errorf("create sale: %w", err)
	}
	tr, err := c.Transfer(ctx, &quotav1.TransferRequest{SaleId: benchSale, Sku: benchSKU, From: transfer.Unallocated, To: benchRegion,
		Units: int64(stock), RequestId: "bench-stock"})
	if err != nil {
		return fmt.Errorf("move the stock to region %s: %w", benchRegion, err)
	}
	if st := tr.GetTransfer().GetState(); st != "posted" {
		return fmt.Errorf("stock transfer %s is %s, not posted", tr.GetTransfer().GetTransferId(), st)
	}
	return nil
}

func (g *rig) close() {
	if g.conn != nil {
		g.conn.Close()
	}
	if g.dev != nil {
		g.dev.Close()
	}
	if g.dataDir != "" {
		os.RemoveAll(g.dataDir)
	}
}

// books reads the region's hold rows for the sale (every hold is one unit) and its pool's
// available units.
func (g *rig) books(ctx context.Context) (rows int64, available transfer.Units, err error) {
	var a int64
	err = g.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM holds WHERE sale_id = $1),
			(SELECT available FROM pools WHERE sale_id = $1 AND sku = $2)`, benchSale, benchSKU).Scan(&rows, &a)
	if err != nil {
		return 0, 0, fmt.Errorf("read region books: %w", err)
	}
	return rows, transfer.Units(a), nil
}

// runReserve is (d): distinct users reserve one unit each until the region says it is empty.
func (g *rig) runReserve(ctx context.Context, cfg *Config) (VariantResult, error) {
	if rows, avail, err := g.books(ctx); err != nil || rows != 0 || avail != cfg.Stock {
		return VariantResult{}, fmt.Errorf("region %s starts with %d holds and %d units, want 0 and %d (%v)", benchRegion, rows, avail, cfg.Stock, err)
	}
	cfg.progress("(d) running")
	prefix := "d" + strconv.FormatUint(cfg.Seed, 10) + "-"
	res := cfg.stockLoad(func(int) attempt { return g.reserve(prefix, false) }).run(ctx)
	res.Variant, res.Label, res.Stock = VariantRegion, "region Reserve over gRPC (end to end)", cfg.Stock
	rows, avail, err := g.books(ctx)
	if err != nil {
		return res, err
	}
	res.HoldRows, res.Remaining = rows, avail
	res.checkUnits(true)
	return res, nil
}

// runSoldOut is (f): the same calls as (d), from new users, once the pool is empty; every
// answer must be REGION_EXHAUSTED.
func (g *rig) runSoldOut(ctx context.Context, cfg *Config) (VariantResult, error) {
	label := "region Reserve over gRPC, pool sold out"
	before, avail, err := g.books(ctx)
	if err != nil {
		return VariantResult{}, err
	}
	if avail != 0 {
		return VariantResult{Variant: VariantSoldOut, Label: label, Skipped: fmt.Sprintf("the pool still has %d units after (d)", avail)}, nil
	}
	cfg.progress("(f) running")
	prefix := "f" + strconv.FormatUint(cfg.Seed, 10) + "-"
	res := cfg.probeLoad(func(int) attempt { return g.reserve(prefix, true) }).run(ctx)
	res.Variant, res.Label = VariantSoldOut, label
	after, left, err := g.books(ctx)
	if err != nil {
		return res, err
	}
	res.HoldRows, res.Remaining = after-before, left
	res.checkUnits(true)
	return res, nil
}

// reserve builds the Reserve attempt: user prefix<n>, one unit. REGION_EXHAUSTED is a
// refusal; with strict, any other answer (SOLD_OUT included) counts as an error.
func (g *rig) reserve(prefix string, strict bool) attempt {
	return func(ctx context.Context, n int64) (outcome, error) {
		_, err := g.region.Reserve(ctx, &quotav1.ReserveRequest{SaleId: benchSale, Sku: benchSKU,
			UserId: prefix + strconv.FormatInt(n, 10), Quantity: 1, RequestKey: "k"})
		if err == nil {
			return took, nil
		}
		switch reason := apierr.Reason(err); {
		case reason == "REGION_EXHAUSTED", reason == "SOLD_OUT" && !strict:
			return refused, nil
		}
		return failed, err
	}
}

// healthCheck is (e): the standard gRPC health check of the region server.
func (g *rig) healthCheck(ctx context.Context, _ int64) (outcome, error) {
	resp, err := g.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return failed, err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return failed, fmt.Errorf("health: %s", resp.GetStatus())
	}
	return answered, nil
}
