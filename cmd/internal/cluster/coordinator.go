package cluster

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/coordinator/coordrpc"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/metrics"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc/credentials"
)

// RegionEndpoint is how the coordinator reaches a region: its gRPC address for transfers,
// and its database (read-only) for audits.
type RegionEndpoint struct {
	Name  string
	Addr  string
	DBURL string
}

// CoordinatorConfig configures a coordinator process.
type CoordinatorConfig struct {
	Listen string
	// Advertise is the gRPC address published in etcd as this process's; "" publishes the
	// address Listen bound.
	Advertise   string
	DBURL       string
	Regions     []RegionEndpoint
	LeaseTTL    time.Duration
	StrandAfter time.Duration
	// RetryInterval is how often unfinished transfers are driven again (default 1s).
	RetryInterval time.Duration
	// AuditInterval is how often the leader audits every sale and pauses each SKU whose
	// conservation (I1) is broken; 0: never (quotad's --audit-interval defaults to
	// coordinator.DefaultAuditInterval).
	AuditInterval time.Duration
	// AuditRetention is how long the continuous audit's rounds are kept in the ledger; 0 is
	// coordinator.DefaultAuditRetention.
	AuditRetention time.Duration
	// Auto is the automatic rebalancer (coordinator.Config.Auto); its zero value is off.
	Auto coordinator.AutoRebalance
	// FollowLeaders makes the coordinator reach each region at the address its current
	// leader publishes in etcd (falling back to the configured one), so a region's failover
	// to a standby on another address is followed.
	FollowLeaders bool
	// TLS is the certificates directory: node.crt for the server, client.coordinator.crt for
	// calls to the regions. Nil runs insecure (plaintext, no roles).
	TLS *trust.Material
	// HTTPListen is the address of the coordinator's HTTP listener, which serves its
	// Prometheus metrics (GET /metrics) and the web console; "" serves none.
	HTTPListen string
	// ConsoleKeys is the console key file (quotactl console keys create) whose keys verify
	// the web console's login tokens: with it the HTTP listener serves the console
	// (docs/console.md). "" serves none, except under insecure TLS, which serves it with no
	// login.
	ConsoleKeys string
	// Limits bound what the gRPC server and the HTTP listener accept (zero fields: the
	// defaults).
	Limits rpcserve.Limits
	Logger *slog.Logger
}

// CoordinatorNode is a running coordinator: ledger, gRPC server, and a campaign.
type CoordinatorNode struct {
	C      *coordinator.Coordinator
	Server *rpcserve.Server
	// HTTP serves the metrics (nil when not served); Metrics is the node's registry.
	HTTP         *rpcserve.HTTPServer
	Metrics      *prometheus.Registry
	metrics      *nodeMetrics
	consoleKeys  *ticketKeys
	console      *coordhttp.Console
	DB           *pgxpool.Pool
	regionDBs    []*pgxpool.Pool
	participants []*coordrpc.Participant
	etcd         *fencing.Client
	status       *statusCache
	cfg          CoordinatorConfig
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	once         sync.Once
	crashed      atomic.Bool
}

// StartCoordinator opens and migrates the ledger, connects to the regions (their gRPC
// addresses and, read-only, their databases), serves CoordinatorService and campaigns.
func StartCoordinator(ctx context.Context, cfg CoordinatorConfig, etcd *fencing.Client) (n *CoordinatorNode, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	node := &CoordinatorNode{etcd: etcd, cfg: cfg}
	n = node
	defer func() { // on every error return (which sets n to nil), close what was opened
		if err != nil {
			node.closeResources()
		}
	}()
	if n.DB, err = pgutil.Open(ctx, cfg.DBURL, 16); err != nil {
		return nil, err
	}
	if err = coordinator.Migrate(ctx, n.DB, pgutil.MigrationLog(cfg.Logger)); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	creds, err := cfg.TLS.ClientCreds(trust.Coordinator)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	links, err := n.linkRegions(ctx, creds)
	if err != nil {
		return nil, err
	}
	n.status = &statusCache{gather: func(ctx context.Context) coordinator.ClusterStatus { return n.gatherStatus(ctx, creds) }}
	n.C, err = coordinator.New(coordinator.Config{Regions: links, StrandAfter: cfg.StrandAfter,
		RetryInterval: cfg.RetryInterval, AuditInterval: cfg.AuditInterval, AuditRetention: cfg.AuditRetention, Logger: cfg.Logger, Auto: cfg.Auto,
		PublishFlag: func(ctx context.Context, f fencing.Flag, sale, sku string, on bool) error {
			return fencing.SetFlag(ctx, etcd, f, sale, sku, on)
		},
		WatchFlags: func(ctx context.Context, fn func(f fencing.Flag, sale, sku string, on bool)) error {
			return fencing.WatchFlags(ctx, etcd, fn)
		},
		Bindings: coordinator.Bindings{
			Follow: func(ctx context.Context, fn func(sale, user, region string)) error {
				return fencing.FollowBindings(ctx, etcd, fn)
			},
			Unbind: func(ctx context.Context, sale, user, region string) (bool, error) {
				return fencing.Unbind(ctx, etcd, sale, user, region)
			},
			Bound: func(ctx context.Context, sale, user string) (string, bool, error) {
				return fencing.Bound(ctx, etcd, sale, user)
			}}}, n.DB)
	if err != nil {
		return nil, err
	}
	if err = n.serve(); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.watchConsoleKeys(cctx)
	n.wg.Add(1)
	go n.campaign(cctx)
	return n, nil
}

// serve registers the node's metrics, then starts, with an address, its HTTP listener of
// metrics and its gRPC server.
func (n *CoordinatorNode) serve() error {
	cfg := n.cfg
	nm := newNodeMetrics(roleCoordinator, "", cfg.TLS)
	n.metrics, n.Metrics = nm, nm.reg
	nm.leader(func() bool { _, err := n.C.Generation(); return err == nil })
	nm.database(n.DB)
	registerCoordinator(nm.reg, n.C)
	var err error
	if cfg.HTTPListen != "" { // first: once started, closeResources stops it if the rest fails
		h, err := n.consoleHandler(metrics.Serve(nm.reg, cfg.TLS.Insecure(), cfg.Logger))
		if err != nil {
			return err
		}
		if n.HTTP, err = rpcserve.ListenHTTP(cfg.HTTPListen, nm.http.Wrap(h), nm.httpOptions(rpcserve.Options{TLS: cfg.TLS, Limits: cfg.Limits, Logger: cfg.Logger})); err != nil {
			return err
		}
		n.HTTP.Start()
	}
	if n.Server, err = rpcserve.Listen(cfg.Listen, nm.serverOptions(rpcserve.Options{TLS: cfg.TLS, Limits: cfg.Limits, Logger: cfg.Logger})); err != nil {
		return err
	}
	quotav1.RegisterCoordinatorServiceServer(n.Server.GRPC, &coordrpc.Server{C: n.C, Logger: n.cfg.Logger, Status: n.Status})
	nm.grpc.InitializeMetrics(n.Server.GRPC)
	n.Server.Start()
	return nil
}

// Status is the cluster's status as this coordinator sees it (gathered at most every 2 s).
func (n *CoordinatorNode) Status(ctx context.Context) (coordinator.ClusterStatus, error) {
	return n.status.get(ctx)
}

// HTTPAddr is the address of the coordinator's HTTP listener (metrics and console), or ""
// when it serves none.
func (n *CoordinatorNode) HTTPAddr() string {
	if n.HTTP == nil {
		return ""
	}
	return n.HTTP.Addr()
}

func (n *CoordinatorNode) linkRegions(ctx context.Context, creds credentials.TransportCredentials) ([]coordinator.RegionLink, error) {
	var links []coordinator.RegionLink
	for _, r := range n.cfg.Regions {
		db, err := pgutil.Open(ctx, r.DBURL, 4)
		if err != nil {
			return nil, fmt.Errorf("region %s database: %w", r.Name, err)
		}
		n.regionDBs = append(n.regionDBs, db)
		var resolve func() string
		if n.cfg.FollowLeaders {
			// The participant keeps what this answers (coordrpc.Participant.target), and asks
			// again when a call finds the leader gone: a cache here could answer that re-ask
			// with the address that just failed.
			role := "region/" + r.Name
			resolve = func() string { return leaderOf(n.etcd, role) }
		}
		p, err := coordrpc.DialResolving(r.Name, r.Addr, resolve, creds)
		if err != nil {
			return nil, err
		}
		n.participants = append(n.participants, p)
		name := r.Name
		links = append(links, coordinator.RegionLink{Name: name, Address: r.Addr, Participant: p, Resolve: resolve,
			Books: func(ctx context.Context, sale string) (transfer.RegionBooks, error) {
				return region.ReadBooks(ctx, db, name, sale)
			},
			BooksOf: func(ctx context.Context, sales []string) (map[string]transfer.RegionBooks, error) {
				return region.ReadBooksOf(ctx, db, name, sales)
			},
			Demand: func(ctx context.Context, sale string, since time.Time) (map[string]transfer.Units, error) {
				return region.RecentDemand(ctx, db, sale, since)
			},
			Unsold: func(ctx context.Context, sale string) (map[string]transfer.Stock, error) {
				return region.ReadUnsold(ctx, db, sale)
			},
			Watch: func(ctx context.Context, ready func(), changed func(string)) error {
				return region.WatchStock(ctx, db, ready, changed)
			},
			BuyerUnits: func(ctx context.Context, sale string, fn func(transfer.BuyerUnits) error) error {
				return region.ReadBuyerUnits(ctx, db, sale, fn)
			},
			LatePayments: func(ctx context.Context, sale string, limit int) ([]transfer.LatePayment, error) {
				return region.ReadLatePayments(ctx, db, name, sale, limit)
			}})
	}
	return links, nil
}

// Addr is the coordinator's gRPC address.
func (n *CoordinatorNode) Addr() string { return n.Server.Addr() }

func (n *CoordinatorNode) campaign(ctx context.Context) {
	defer n.wg.Done()
	campaign(ctx, term{etcd: n.etcd, role: "coordinator", addr: cmp.Or(n.cfg.Advertise, n.Addr()), ttl: n.cfg.LeaseTTL, log: n.cfg.Logger,
		lead: n.C.Lead, stepDn: n.C.StepDown, crashed: &n.crashed, tookOver: n.metrics.tookOver})
}

// Crash stops the node the way a killed process stops: calls in progress are cut, and its
// leadership is not resigned but left to expire with its lease.
func (n *CoordinatorNode) Crash() {
	n.crashed.Store(true)
	n.once.Do(func() {
		n.Server.GRPC.Stop()
		n.cancel()
		n.wg.Wait()
		n.C.Close()
		n.closeResources()
	})
}

// WaitLeading waits until the coordinator leads.
func (n *CoordinatorNode) WaitLeading(ctx context.Context) error {
	for {
		if _, err := n.C.Generation(); err == nil {
			return nil
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("coordinator never led: %w", err)
		}
	}
}

func (n *CoordinatorNode) closeResources() {
	if n.HTTP != nil {
		n.HTTP.Stop()
	}
	for _, p := range n.participants {
		p.Close()
	}
	for _, db := range n.regionDBs {
		db.Close()
	}
	if n.DB != nil {
		n.DB.Close()
	}
}

// Close stops serving, resigns and closes connections. Idempotent.
func (n *CoordinatorNode) Close() {
	n.once.Do(func() {
		n.Server.Stop()
		n.cancel()
		n.wg.Wait()
		n.C.Close()
		n.closeResources()
	})
}
