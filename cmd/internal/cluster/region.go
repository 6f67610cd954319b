// Package cluster wires the roles into running processes: a region or a coordinator with its
// database, its gRPC server and its etcd election, and `quotad dev`'s all-in-one cluster.
// cmd/quotad and the integration tests both start servers through it.
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
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/metrics"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/region/regionhttp"
	"github.com/quotaworks/quota/region/regionrpc"
	"google.golang.org/grpc"
)

// RegionConfig configures one region process.
type RegionConfig struct {
	Region region.Config
	// NoMetrics leaves out the region's counts and the gRPC server's metrics (its /metrics
	// still serves the process's): for the benchmark that measures what metrics cost.
	NoMetrics bool
	// Listen is the gRPC address (host:port; port 0 picks one).
	Listen string
	// Advertise is the gRPC address published in etcd as this process's, where clients and
	// the coordinator reach it when it leads; "" publishes the address Listen bound.
	Advertise string
	// DBURL is the region's own database.
	DBURL string
	// LeaseTTL is the etcd lease of the region's leadership.
	LeaseTTL time.Duration
	// Region.CoordinatorGeneration defaults to the coordinator leader's generation in etcd.
	// TLS is the certificates directory (node.crt); nil runs insecure (plaintext, no roles).
	TLS *trust.Material
	// HTTPListen is the storefront HTTP/JSON edge's address; "" serves none.
	HTTPListen string
	// RoomListen is the waiting-room page's public listener (a server certificate only, for
	// shoppers' browsers); "" serves none. It needs TicketKeys.
	RoomListen string
	// TicketKeys is the cluster's ticket key file; "" opens no front door (no waiting
	// rooms: a sale with one cannot be reserved here).
	TicketKeys string
	// BindRetention is how long the buyer-to-region bindings of a sale live in etcd; default
	// 7 days.
	BindRetention time.Duration
	// NearEtcd, when set, is a client of the region's own etcd member only: buyer bindings are
	// written through it first (fencing.NewBinderNear). The caller closes it.
	NearEtcd *fencing.Client
	// Limits bound what the gRPC server and the HTTP edge accept (zero fields: the defaults).
	Limits rpcserve.Limits
	// NoBindAtReserve leaves out the binding of a buyer at their first reservation in a sale
	// without a waiting room (region.Config.Binding.Bind), so the per-user limit of such a sale holds
	// per region only: for the benchmark that measures what the binding costs. Admissions to
	// a waiting room bind as ever.
	NoBindAtReserve bool
	Logger          *slog.Logger
}

// RegionNode is a running region: database, gRPC server and a campaign for leadership.
type RegionNode struct {
	R      *region.Region
	Server *rpcserve.Server
	// HTTP is the storefront edge (nil when not served); Door the front door behind both APIs.
	HTTP *rpcserve.HTTPServer
	Door *region.Door
	// Room is the waiting-room page's public listener (nil when not served).
	Room *rpcserve.HTTPServer
	// Metrics is the node's Prometheus registry, served at /metrics on the HTTP edge.
	Metrics *prometheus.Registry
	metrics *nodeMetrics
	binder  *fencing.Binder
	DB      *pgxpool.Pool
	etcd    *fencing.Client
	cfg     RegionConfig
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
	crashed atomic.Bool
}

// leaderOf reads the address published by role's leader in etcd, or "" when unknown.
func leaderOf(etcd *fencing.Client, role string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	addr, _, err := fencing.Leader(ctx, etcd, role)
	if err != nil {
		return ""
	}
	return addr
}

// hintTTL is how long a NOT_LEADER answer's leader address is reused before etcd is asked
// again: a standby, or a leader just deposed, may answer thousands of requests a second.
const hintTTL = 250 * time.Millisecond

// cachedHint wraps fetch so that it runs at most once per ttl and never twice at once. Once
// there is an answer, callers are never held up by a fetch: the last answer serves until a
// new one is in, even past the ttl while the one caller that saw it stale fetches (with etcd
// slow or gone, a fetch takes up to leaderOf's timeout, and a standby answers thousands of
// requests a second). Only callers arriving before the first answer wait for it. A client
// sent to an address that is already stale is told NOT_LEADER there and asks again.
func cachedHint(ttl time.Duration, fetch func() string) func() string {
	var (
		mu       sync.Mutex
		addr     string
		at       time.Time     // when addr was fetched; zero until the first answer
		fetching chan struct{} // closed when the running fetch ends; nil when none runs
	)
	return func() string {
		mu.Lock()
		if !at.IsZero() && (fetching != nil || time.Since(at) < ttl) {
			defer mu.Unlock()
			return addr
		}
		if wait := fetching; wait != nil { // the first fetch is under way
			mu.Unlock()
			<-wait
			mu.Lock()
			defer mu.Unlock()
			return addr
		}
		done := make(chan struct{})
		fetching = done
		mu.Unlock()
		got := ""
		defer func() { // even if fetch panics, so no caller waits on it for ever
			mu.Lock()
			addr, at, fetching = got, time.Now(), nil
			mu.Unlock()
			close(done)
		}()
		got = fetch()
		return got
	}
}

// Crash stops the node the way a killed process stops: calls in progress are cut, queued
// work fails, and its leadership is left to expire with its lease instead of being resigned.
func (n *RegionNode) Crash() {
	n.crashed.Store(true)
	n.once.Do(func() {
		n.Server.GRPC.Stop()
		n.stopEdge()
		n.cancel()
		n.wg.Wait()
		n.R.Close()
		n.DB.Close()
	})
}

// stopEdge stops the HTTP edge and the front door; each part once.
func (n *RegionNode) stopEdge() {
	if n.HTTP != nil {
		n.HTTP.Stop()
	}
	if n.Room != nil {
		n.Room.Stop()
	}
	if n.Door != nil {
		n.Door.Close()
	}
	closeBinder(n.binder, n.cfg)
}

// closeBinder closes the buyer bindings' writer: the region and its door bind no one after.
func closeBinder(b *fencing.Binder, cfg RegionConfig) {
	if err := b.Close(); err != nil {
		cfg.Logger.Warn("closing the buyer bindings", "region", cfg.Region.Name, "err", err)
	}
}

// StartRegion opens and migrates the region's database, starts its gRPC server (answering
// NOT_LEADER until elected) and campaigns for the region's leadership in etcd.
func StartRegion(ctx context.Context, cfg RegionConfig, etcd *fencing.Client) (*RegionNode, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Region.Logger = cfg.Logger
	cfg.Region.Cluster.LeaderHint = cachedHint(hintTTL, func() string { return leaderOf(etcd, "region/"+cfg.Region.Name) })
	flags := &flagSet{}
	cfg.Region.Cluster.SoldOut = flags.has(fencing.SoldOut)
	cfg.Region.Cluster.Drained = flags.has(fencing.Drained)
	if cfg.Region.Cluster.CoordinatorGeneration == nil {
		cfg.Region.Cluster.CoordinatorGeneration = coordinatorGeneration(etcd)
	}
	var keys *ticketKeys
	if cfg.TicketKeys != "" {
		var err error
		if keys, err = loadTicketKeys(cfg.TicketKeys, cfg.Logger); err != nil {
			return nil, err
		}
		cfg.Region.Cluster.Tickets = keys.get
	}
	nm := newNodeMetrics(roleRegion, cfg.Region.Name, cfg.TLS)
	if nm.off = cfg.NoMetrics; !nm.off {
		cfg.Region.Metrics = newRegionMetrics(nm.reg, cfg.Region.Name)
	}
	binder := fencing.NewBinderNear(etcd, cfg.NearEtcd, cmp.Or(cfg.BindRetention, fencing.DefaultBindRetention))
	if !cfg.NoBindAtReserve {
		cfg.Region.Binding.Bind = binder.Bind
	}
	r, db, err := openRegion(ctx, cfg)
	if err != nil {
		closeBinder(binder, cfg)
		return nil, err
	}
	registerRegion(nm.reg, r)
	nm.leader(r.Leading)
	nm.database(db)
	srv, err := rpcserve.Listen(cfg.Listen, nm.serverOptions(rpcserve.Options{TLS: cfg.TLS, Limits: cfg.Limits, Logger: cfg.Logger,
		Guards: []grpc.UnaryServerInterceptor{rpcserve.AddressedTo(cfg.Region.Name)}}))
	if err != nil {
		closeBinder(binder, cfg)
		db.Close()
		return nil, err
	}
	n := &RegionNode{R: r, Server: srv, DB: db, Metrics: nm.reg, metrics: nm, binder: binder, etcd: etcd, cfg: cfg}
	rs := &regionrpc.Server{R: r}
	if err := n.openEdges(rs, keys); err != nil {
		srv.Stop()
		n.stopEdge()
		db.Close()
		return nil, err
	}
	quotav1.RegisterRegionServiceServer(srv.GRPC, rs)
	quotav1.RegisterParticipantServiceServer(srv.GRPC, rs)
	nm.grpc.InitializeMetrics(srv.GRPC)
	srv.Start()
	if n.HTTP != nil {
		n.HTTP.Start()
	}
	if n.Room != nil {
		n.Room.Start()
	}
	cctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	if keys != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			keys.watch(cctx)
		}()
	}
	n.wg.Add(3)
	go n.campaign(cctx)
	go n.watchSoldOut(cctx, flags)
	go func() {
		defer n.wg.Done()
		r.KeepWarm(cctx)
	}()
	return n, nil
}

// openRegion opens and migrates the region's database and builds the region on it.
func openRegion(ctx context.Context, cfg RegionConfig) (*region.Region, *pgxpool.Pool, error) {
	db, err := pgutil.Open(ctx, cfg.DBURL, 32)
	if err != nil {
		return nil, nil, err
	}
	if err := region.Migrate(ctx, db, pgutil.MigrationLog(cfg.Logger)); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("region %s: %w", cfg.Region.Name, err)
	}
	r, err := region.New(cfg.Region, db)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return r, db, nil
}

// coordinatorGeneration reads the coordinator leader's generation from etcd.
func coordinatorGeneration(etcd *fencing.Client) func(ctx context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		_, gen, err := fencing.Leader(ctx, etcd, "coordinator")
		return gen, err
	}
}

// openEdges opens the front door, the storefront edge and the waiting-room page.
func (n *RegionNode) openEdges(rs *regionrpc.Server, keys *ticketKeys) error {
	if err := n.openEdge(rs, keys); err != nil {
		return err
	}
	return n.openRoom(keys)
}

// openRoom opens the waiting-room page's public listener, when asked for: a server
// certificate only (Public), under the listener limits of every quotad port.
func (n *RegionNode) openRoom(keys *ticketKeys) error {
	cfg := n.cfg
	if cfg.RoomListen == "" {
		return nil
	}
	if keys == nil || n.Door == nil {
		return fmt.Errorf("room-listen %s: the waiting-room page needs the cluster's ticket keys (--ticket-keys)", cfg.RoomListen)
	}
	h, err := regionhttp.RoomHandler(n.Door, regionhttp.RoomOptions{Region: cfg.Region.Name, Keys: keys.get, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	rs, err := rpcserve.ListenHTTP(cfg.RoomListen, h, n.metrics.httpOptions(rpcserve.Options{TLS: cfg.TLS, Limits: cfg.Limits,
		Logger: cfg.Logger, Public: true}))
	if err != nil {
		return fmt.Errorf("room-listen: %w", err)
	}
	n.Room = rs
	return nil
}

// RoomAddr is the waiting-room page's address, or "" when it serves none.
func (n *RegionNode) RoomAddr() string {
	if n.Room == nil {
		return ""
	}
	return n.Room.Addr()
}

// openEdge opens the front door (with ticket keys) and the HTTP edge (with an address).
func (n *RegionNode) openEdge(rs *regionrpc.Server, keys *ticketKeys) error {
	cfg := n.cfg
	if keys != nil {
		door, err := region.NewDoor(n.R, region.DoorConfig{Keys: keys.get, Bind: n.binder.Bind, Logger: cfg.Logger})
		if err != nil {
			return err
		}
		n.Door, rs.D = door, door
		n.metrics.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quota_line_polls_total",
			ConstLabels: prometheus.Labels{"region": cfg.Region.Name},
			Help:        "Polls of admissions this region process answered itself (its HTTP edge, its gRPC API and its waiting-room page); polls a storefront edge answers from its copy of the line are not among them."},
			func() float64 { return float64(door.Polls()) }))
	}
	if cfg.HTTPListen == "" {
		return nil
	}
	edge := regionhttp.Handler(n.R, n.Door, regionhttp.Options{Insecure: cfg.TLS.Insecure(), Logger: cfg.Logger,
		Metrics: metrics.Handler(n.metrics.reg, cfg.Logger)})
	hs, err := rpcserve.ListenHTTP(cfg.HTTPListen, n.metrics.http.Wrap(edge), n.metrics.httpOptions(rpcserve.Options{TLS: cfg.TLS, Limits: cfg.Limits, Logger: cfg.Logger}))
	if err != nil {
		return err
	}
	n.HTTP = hs
	return nil
}

// HTTPAddr is the storefront edge's address, or "" when it serves none.
func (n *RegionNode) HTTPAddr() string {
	if n.HTTP == nil {
		return ""
	}
	return n.HTTP.Addr()
}

// flagSet is the region's copy of the coordinator's stock flags (fencing.Flag).
type flagSet struct{ m sync.Map }

type flagOf struct {
	f         fencing.Flag
	sale, sku string
}

// has returns the test of one flag.
func (s *flagSet) has(f fencing.Flag) func(sale, sku string) bool {
	return func(sale, sku string) bool {
		_, ok := s.m.Load(flagOf{f, sale, sku})
		return ok
	}
}

// watchSoldOut follows the stock flags in etcd until ctx ends, starting again after an
// error (the flags only pick answers, so a gap is harmless).
func (n *RegionNode) watchSoldOut(ctx context.Context, flags *flagSet) {
	defer n.wg.Done()
	for ctx.Err() == nil {
		flags.m.Clear()
		err := fencing.WatchFlags(ctx, n.etcd, func(f fencing.Flag, sale, sku string, on bool) {
			if on {
				flags.m.Store(flagOf{f, sale, sku}, true)
			} else {
				flags.m.Delete(flagOf{f, sale, sku})
			}
		})
		if err != nil && ctx.Err() == nil {
			n.cfg.Logger.Warn("stock flag watch ended", "region", n.cfg.Region.Name, "err", err)
		}
		sleep(ctx, time.Second)
	}
}

// Addr is the region's gRPC address.
func (n *RegionNode) Addr() string { return n.Server.Addr() }

func (n *RegionNode) campaign(ctx context.Context) {
	defer n.wg.Done()
	campaign(ctx, term{etcd: n.etcd, role: "region/" + n.cfg.Region.Name, addr: cmp.Or(n.cfg.Advertise, n.Addr()), ttl: n.cfg.LeaseTTL, log: n.cfg.Logger,
		lead: n.R.Lead, stopped: n.R.Stopped, stepDn: n.R.StepDown, crashed: &n.crashed, tookOver: n.metrics.tookOver})
}

// WaitLeading waits until the region serves as leader.
func (n *RegionNode) WaitLeading(ctx context.Context) error {
	for !n.R.Leading() {
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("region %s never led: %w", n.cfg.Region.Name, err)
		}
	}
	return nil
}

// Close stops serving, resigns and closes the database. Idempotent.
func (n *RegionNode) Close() {
	n.once.Do(func() {
		n.Server.Stop()
		n.stopEdge()
		n.cancel()
		n.wg.Wait()
		n.R.Close()
		n.DB.Close()
	})
}

// sleep is clock.Sleep.
func sleep(ctx context.Context, d time.Duration) error { return clock.Sleep(ctx, d) }
