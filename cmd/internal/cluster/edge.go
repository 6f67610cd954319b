package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotaworks/quota/internal/metrics"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/region/regionedge"
	"github.com/quotaworks/quota/region/regionhttp"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// EdgeConfig configures one storefront edge process (quotad edge): the storefront HTTP API
// of a region, served without leading it (docs/storefront.md, "Edges").
type EdgeConfig struct {
	// Region is the region's name.
	Region string
	// Upstream are the gRPC addresses of the region's processes (leader and standbys); the
	// edge finds the leader among them and follows NOT_LEADER answers.
	Upstream []string
	// Listen is the storefront HTTP/JSON address (port 0 picks one).
	Listen string
	// RoomListen, when set, is the waiting-room page's public listener (a server certificate
	// only, for shoppers' browsers): the page a region serves at --room-listen, answered by
	// the edge (docs/storefront.md, "The waiting-room page").
	RoomListen string
	// ReusePort lets several edges listen on one Listen address, and one RoomListen
	// (SO_REUSEPORT, Linux): the kernel spreads new connections among the live ones.
	ReusePort bool
	// TicketKeys is the cluster's ticket key file (required).
	TicketKeys string
	// Refresh and MaxStale tune the lines' fetch (regionedge.Config); zero: the defaults.
	Refresh, MaxStale time.Duration
	// TLS is the certificates directory: node.crt serves storefronts, client.storefront.crt
	// calls the region; nil runs insecure.
	TLS    *trust.Material
	Limits rpcserve.Limits
	Logger *slog.Logger
}

// Validate checks the configuration, naming the bad field.
func (c *EdgeConfig) Validate() error {
	if why := transfer.CheckRegion(c.Region); why != "" {
		return fmt.Errorf("region %q: %s", c.Region, why)
	}
	if len(c.Upstream) == 0 {
		return errors.New("upstream: name the gRPC address of at least one of the region's processes")
	}
	for _, a := range c.Upstream {
		if err := checkHostPort(a); err != nil {
			return fmt.Errorf("upstream %q: %w", a, err)
		}
	}
	if c.TicketKeys == "" {
		return errors.New("ticket-keys: must be set: the edge signs admitted buyers' tickets and checks tickets with them")
	}
	if c.Refresh < 0 || c.MaxStale < 0 {
		return fmt.Errorf("refresh %s, max-stale %s: must not be negative (0: the default)", c.Refresh, c.MaxStale)
	}
	return nil
}

// EdgeNode is a running storefront edge.
type EdgeNode struct {
	Edge *regionedge.Edge
	HTTP *rpcserve.HTTPServer
	// Room is the waiting-room page's public listener; nil without RoomListen.
	Room *rpcserve.HTTPServer
	// Metrics is the edge's Prometheus registry, served at /metrics.
	Metrics  *prometheus.Registry
	upstream *regionedge.Upstream
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

// StartEdge starts a storefront edge: its ticket keys (watched for a rotation), its client
// of the region's leader, its lines and its HTTP listener.
func StartEdge(cfg EdgeConfig) (*EdgeNode, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	keys, err := loadTicketKeys(cfg.TicketKeys, cfg.Logger)
	if err != nil {
		return nil, err
	}
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if !cfg.TLS.Insecure() {
		if creds, err = cfg.TLS.ClientCreds(trust.Storefront); err != nil {
			return nil, fmt.Errorf("edge: the storefront's client certificate: %w", err)
		}
	}
	up, err := regionedge.NewUpstream(cfg.Region, cfg.Upstream, creds)
	if err != nil {
		return nil, err
	}
	e, err := regionedge.New(regionedge.Config{Region: cfg.Region, Upstream: up, Keys: keys.get, Refresh: cfg.Refresh,
		MaxStale: cfg.MaxStale, Logger: cfg.Logger})
	if err != nil {
		up.Close()
		return nil, err
	}
	n := &EdgeNode{Edge: e, upstream: up}
	nm := newNodeMetrics(roleEdge, cfg.Region, cfg.TLS)
	n.Metrics = nm.reg
	registerEdge(nm.reg, cfg.Region, e)
	h := regionhttp.Serve(e, e, e.Carts(), regionhttp.Options{Insecure: cfg.TLS.Insecure(), Logger: cfg.Logger,
		Metrics: metrics.Handler(nm.reg, cfg.Logger)})
	if n.HTTP, err = rpcserve.ListenHTTP(cfg.Listen, nm.http.Wrap(h), nm.httpOptions(rpcserve.Options{TLS: cfg.TLS,
		Limits: cfg.Limits, Logger: cfg.Logger, ReusePort: cfg.ReusePort})); err != nil {
		e.Close()
		up.Close()
		return nil, fmt.Errorf("edge listen: %w", err)
	}
	if n.Room, err = openEdgeRoom(cfg, e, keys, nm); err != nil {
		n.HTTP.Stop()
		e.Close()
		up.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		keys.watch(ctx)
	}()
	n.HTTP.Start()
	if n.Room != nil {
		n.Room.Start()
	}
	return n, nil
}

// openEdgeRoom opens the waiting-room page's public listener of edge e, when cfg asks for
// one: the region's page (regionhttp.ServeRoom) over the edge, a server certificate only.
func openEdgeRoom(cfg EdgeConfig, e *regionedge.Edge, keys *ticketKeys, nm *nodeMetrics) (*rpcserve.HTTPServer, error) {
	if cfg.RoomListen == "" {
		return nil, nil
	}
	h, err := regionhttp.ServeRoom(e, regionhttp.RoomOptions{Region: cfg.Region, Keys: keys.get, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	rs, err := rpcserve.ListenHTTP(cfg.RoomListen, h, nm.httpOptions(rpcserve.Options{TLS: cfg.TLS, Limits: cfg.Limits,
		Logger: cfg.Logger, ReusePort: cfg.ReusePort, Public: true}))
	if err != nil {
		return nil, fmt.Errorf("edge room-listen: %w", err)
	}
	return rs, nil
}

// registerEdge exports the edge's poll counts.
func registerEdge(reg prometheus.Registerer, regionName string, e *regionedge.Edge) {
	for _, by := range []string{"edge", "leader"} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quota_edge_polls_total",
			ConstLabels: prometheus.Labels{"region": regionName, "answered_by": by},
			Help:        "Polls of admissions at this storefront edge, by who answered: edge (from its copy of the line), or leader (forwarded: an admission its copy did not hold yet, or a copy too stale)."},
			func() float64 {
				answered, forwarded := e.Polls()
				if by == "edge" {
					return float64(answered)
				}
				return float64(forwarded)
			}))
	}
}

// Addr is the edge's HTTP address.
func (n *EdgeNode) Addr() string { return n.HTTP.Addr() }

// RoomAddr is the waiting-room page's address, or "" when the edge serves none.
func (n *EdgeNode) RoomAddr() string {
	if n.Room == nil {
		return ""
	}
	return n.Room.Addr()
}

// Close stops serving, then the lines' fetch and the upstream's connections; idempotent.
func (n *EdgeNode) Close() {
	n.once.Do(func() {
		if n.Room != nil {
			n.Room.Stop()
		}
		n.HTTP.Stop()
		n.cancel()
		n.wg.Wait()
		n.Edge.Close()
		n.upstream.Close()
	})
}

// checkHostPort refuses an address that is not host:port with a host and a port.
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return fmt.Errorf("want host:port: %v", err)
	case host == "":
		return errors.New("the host is empty")
	case port == "" || port == "0":
		return errors.New("name the port")
	}
	return nil
}
