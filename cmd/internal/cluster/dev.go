package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// DevConfig configures `quotad dev`: an embedded etcd, a coordinator and regions in one
// process, each with its own database on one PostgreSQL server.
type DevConfig struct {
	Regions []string
	// PGURL names the PostgreSQL server and a database to connect to for creating the others.
	PGURL string
	// DBPrefix prefixes every database name: <prefix>_coordinator, <prefix>_region_<name>.
	DBPrefix string
	// DataDir holds the embedded etcd's data.
	DataDir string
	// Host is the address every server binds.
	Host string
	// BasePort is the coordinator's port; regions take the next ports in order, their HTTP
	// edges BasePort+1001 on, their waiting-room pages BasePort+1101 on, the coordinator's
	// HTTP listener of metrics BasePort+1000, the
	// embedded etcd BasePort+90 (clients) and BasePort+91 (peers). 0 picks free ports.
	BasePort int
	// LeaseTTL is every election's lease.
	LeaseTTL time.Duration
	// Region tunes every region (Name is set per region).
	Region region.Config
	// AuditInterval is the coordinator's continuous audit (CoordinatorConfig.AuditInterval);
	// 0: none.
	AuditInterval time.Duration
	// AuditRetention is how long the coordinator keeps the audit's rounds (0: the default).
	AuditRetention time.Duration
	// NoMetrics runs the regions without their metrics (RegionConfig.NoMetrics).
	NoMetrics bool
	// Limits bound what every listener accepts (zero fields: the defaults).
	Limits rpcserve.Limits
	// NoBindAtReserve runs the regions without binding buyers at their first reservation
	// (RegionConfig.NoBindAtReserve).
	NoBindAtReserve bool
	// Auto is the coordinator's automatic rebalancer (CoordinatorConfig.Auto).
	Auto coordinator.AutoRebalance
	// CertsDir holds the cluster's certificates; whatever is missing is created at start
	// (default <DataDir>/certs).
	CertsDir string
	// Insecure runs every server plaintext with no roles, for people who ask for it.
	Insecure bool
	// TicketKeys is the cluster's ticket key file, created at start when missing (default
	// <DataDir>/tickets.keys).
	TicketKeys string
	// ConsoleKeys is the web console's key file, created at start when missing (default
	// <DataDir>/console.keys); unused when Insecure (the console has no login then).
	ConsoleKeys string
	// EtcdGateway serves the embedded etcd's JSON gateway (fencing.EmbeddedConfig.Gateway);
	// off by default.
	EtcdGateway bool
	// Edges is how many storefront edges (StartEdge) run in front of each region, 0 to
	// MaxDevEdges; the i-th region's j-th edge listens on BasePort+1201+MaxDevEdges*i+j.
	Edges  int
	Logger *slog.Logger
}

// MaxDevEdges bounds DevConfig.Edges.
const MaxDevEdges = 8

// Validate checks the configuration, naming the bad field.
func (c *DevConfig) Validate() error {
	if len(c.Regions) == 0 {
		return errors.New("regions: name at least one region")
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if why := transfer.CheckRegion(r); why != "" {
			return fmt.Errorf("regions: %q %s", r, why)
		}
		if seen[r] {
			return fmt.Errorf("regions: %q listed twice", r)
		}
		seen[r] = true
	}
	if c.PGURL == "" {
		return errors.New("pg-url: must be set")
	}
	if _, err := pgutil.WithDatabase(c.PGURL, "x"); err != nil {
		return fmt.Errorf("pg-url: %w", err)
	}
	if c.DBPrefix == "" || strings.ContainsAny(c.DBPrefix, "-. ") || strings.ToLower(c.DBPrefix) != c.DBPrefix {
		return fmt.Errorf("db-prefix %q: must be lowercase letters, digits and _", c.DBPrefix)
	}
	if c.DataDir == "" {
		return errors.New("data-dir: must be set")
	}
	if c.BasePort < 0 || c.BasePort > 65000 {
		return fmt.Errorf("base-port %d: must be 0..65000", c.BasePort)
	}
	if c.LeaseTTL < time.Second {
		return fmt.Errorf("lease-ttl %s: must be at least 1s", c.LeaseTTL)
	}
	if c.AuditInterval < 0 {
		return fmt.Errorf("audit-interval %s: must not be negative (0: no continuous audit)", c.AuditInterval)
	}
	if c.AuditRetention < 0 {
		return fmt.Errorf("audit-retention %s: must be positive (0: the default)", c.AuditRetention)
	}
	if c.Edges < 0 || c.Edges > MaxDevEdges {
		return fmt.Errorf("edges %d: must be 0..%d per region", c.Edges, MaxDevEdges)
	}
	if c.TicketKeys == "" {
		c.TicketKeys = filepath.Join(c.DataDir, TicketKeysFile)
	}
	if c.CertsDir == "" && !c.Insecure {
		c.CertsDir = filepath.Join(c.DataDir, "certs")
	}
	if c.ConsoleKeys == "" && !c.Insecure {
		c.ConsoleKeys = filepath.Join(c.DataDir, ConsoleKeysFile)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// certs creates what is missing of the dev certificates, or has expired or nears its end
// (trust.EnsureDev), and loads them (nil when insecure).
func (c *DevConfig) certs() (*trust.Material, []string, error) {
	if c.Insecure {
		return nil, nil, nil
	}
	hosts := trust.DevHosts
	if c.Host != "" && !slices.Contains(hosts, c.Host) {
		hosts = append(slices.Clone(hosts), c.Host)
	}
	made, err := trust.EnsureDev(c.CertsDir, hosts)
	if err != nil {
		return nil, nil, fmt.Errorf("certs-dir: %w", err)
	}
	etcdMade, err := trust.EnsureDevEtcd(c.CertsDir, c.Regions)
	if err != nil {
		return nil, nil, fmt.Errorf("certs-dir: %w", err)
	}
	made = append(made, etcdMade...)
	m, err := trust.Load(c.CertsDir)
	if err == nil {
		WarnCertificates(c.CertsDir, time.Now(), c.Logger) // a CA near its end, say
	}
	return m, made, err
}

// Dev is a running all-in-one cluster.
type Dev struct {
	Etcd *fencing.Embedded
	// EtcdClient is etcd's administrator (root; with authentication on unless insecure): the
	// setup of users and roles, and tests. Every node dials etcd as its own user.
	EtcdClient  *fencing.Client
	nodeEtcd    []*fencing.Client
	Coordinator *CoordinatorNode
	Regions     []*RegionNode
	// Edges are each region's storefront edges (DevConfig.Edges), by region name.
	Edges  map[string][]*EdgeNode
	DBURLs map[string]string // "coordinator" and region names → database URL
	// TLS is the cluster's certificates (nil when insecure); CertsMade names the files this
	// start created.
	TLS       *trust.Material
	CertsMade []string
	// TicketKeys is the ticket key file; TicketKeysMade says this start created it.
	TicketKeys     string
	TicketKeysMade bool
	// ConsoleKeys is the console key file ("" when insecure); ConsoleKeysMade says this
	// start created it.
	ConsoleKeys     string
	ConsoleKeysMade bool
}

// DBName is the database a dev cluster uses for role ("coordinator" or a region name).
func DBName(prefix, role string) string {
	if role == "coordinator" {
		return prefix + "_coordinator"
	}
	return prefix + "_region_" + strings.ReplaceAll(role, "-", "_")
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *DevConfig) etcdURLs() (string, string, error) {
	scheme := "https://"
	if c.Insecure {
		scheme = "http://"
	}
	if c.BasePort != 0 {
		return scheme + net.JoinHostPort(c.Host, strconv.Itoa(c.BasePort+90)), scheme + net.JoinHostPort(c.Host, strconv.Itoa(c.BasePort+91)), nil
	}
	cp, err := freePort(c.Host)
	if err != nil {
		return "", "", err
	}
	pp, err := freePort(c.Host)
	if err != nil {
		return "", "", err
	}
	return scheme + net.JoinHostPort(c.Host, strconv.Itoa(cp)), scheme + net.JoinHostPort(c.Host, strconv.Itoa(pp)), nil
}

func (c *DevConfig) listen(offset int) string {
	if c.BasePort == 0 {
		return net.JoinHostPort(c.Host, "0")
	}
	return net.JoinHostPort(c.Host, strconv.Itoa(c.BasePort+offset))
}

// StartDev starts the embedded etcd, creates the databases when missing, starts the regions,
// then the coordinator, and waits until every one leads.
func StartDev(ctx context.Context, cfg DevConfig) (*Dev, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Dev{DBURLs: map[string]string{}}
	if err := d.start(ctx, cfg); err != nil {
		d.Close() // whatever started stops again
		return nil, err
	}
	return d, nil
}

// etcdDialTimeout bounds the first request to the embedded etcd. After a crash it replays
// its log before it answers, which on a loaded machine takes more than a few seconds.
const etcdDialTimeout = 30 * time.Second

// startEtcd starts the embedded etcd and returns its client URL. Ports picked free (base port
// 0) come from the ephemeral range, where an outgoing connection can take one between the pick
// and etcd's bind; a fresh pick then fixes it, a fixed port is the operator's to free.
func (d *Dev) startEtcd(cfg DevConfig) (string, error) {
	for try := 1; ; try++ {
		clientURL, peerURL, err := cfg.etcdURLs()
		if err != nil {
			return "", err
		}
		d.Etcd, err = fencing.StartEmbeddedConfig(fencing.EmbeddedConfig{Dir: filepath.Join(cfg.DataDir, "etcd"),
			ClientURL: clientURL, PeerURL: peerURL, TLS: memberFiles(d.TLS, cfg.Regions), Gateway: cfg.EtcdGateway})
		if err == nil {
			return clientURL, nil
		}
		if cfg.BasePort != 0 || try == 3 || !errors.Is(err, syscall.EADDRINUSE) {
			return "", err
		}
	}
}

func (d *Dev) start(ctx context.Context, cfg DevConfig) error {
	var err error
	if d.TLS, d.CertsMade, err = cfg.certs(); err != nil {
		return err
	}
	d.TicketKeys = cfg.TicketKeys
	if d.TicketKeysMade, err = EnsureTicketKeys(cfg.TicketKeys); err != nil {
		return err
	}
	if d.ConsoleKeys = cfg.ConsoleKeys; !cfg.Insecure {
		if d.ConsoleKeysMade, err = EnsureConsoleKeys(cfg.ConsoleKeys); err != nil {
			return err
		}
	}
	var clientURL string
	if err := inComponent(ctx, "etcd", func(context.Context) (err error) { clientURL, err = d.startEtcd(cfg); return err }); err != nil {
		return err
	}
	if err := inComponent(ctx, "etcd-client", func(ctx context.Context) error { return d.secureEtcd(ctx, clientURL, cfg.Regions) }); err != nil {
		return err
	}
	for _, role := range append([]string{"coordinator"}, cfg.Regions...) {
		name := DBName(cfg.DBPrefix, role)
		if err := pgutil.EnsureDatabase(ctx, cfg.PGURL, name); err != nil {
			return err
		}
		if d.DBURLs[role], err = pgutil.WithDatabase(cfg.PGURL, name); err != nil {
			return err
		}
	}
	var eps []RegionEndpoint
	for i, name := range cfg.Regions {
		rc := cfg.Region
		rc.Name = name
		var n *RegionNode
		err := inComponent(ctx, "region/"+name, func(ctx context.Context) (err error) {
			etcd, err := d.etcdAs(trust.EtcdRegion(name), clientURL)
			if err != nil {
				return err
			}
			n, err = StartRegion(ctx, RegionConfig{Region: rc, Listen: cfg.listen(1 + i), HTTPListen: cfg.listen(1001 + i), RoomListen: cfg.listen(1101 + i), DBURL: d.DBURLs[name],
				LeaseTTL: cfg.LeaseTTL, TLS: d.TLS, TicketKeys: cfg.TicketKeys, Logger: cfg.Logger, NoMetrics: cfg.NoMetrics, Limits: cfg.Limits,
				NoBindAtReserve: cfg.NoBindAtReserve}, etcd)
			return err
		})
		if err != nil {
			return err
		}
		d.Regions = append(d.Regions, n)
		eps = append(eps, RegionEndpoint{Name: name, Addr: n.Addr(), DBURL: d.DBURLs[name]})
	}
	for _, n := range d.Regions {
		if err := n.WaitLeading(ctx); err != nil {
			return err
		}
	}
	if err := d.startEdges(ctx, cfg); err != nil {
		return err
	}
	err = inComponent(ctx, "coordinator", func(ctx context.Context) (err error) {
		etcd, err := d.etcdAs(trust.EtcdCoordinator, clientURL)
		if err != nil {
			return err
		}
		d.Coordinator, err = StartCoordinator(ctx, CoordinatorConfig{Listen: cfg.listen(0), HTTPListen: cfg.listen(1000), DBURL: d.DBURLs["coordinator"],
			Regions: eps, LeaseTTL: cfg.LeaseTTL, AuditInterval: cfg.AuditInterval, AuditRetention: cfg.AuditRetention, Auto: cfg.Auto, TLS: d.TLS, Logger: cfg.Logger, FollowLeaders: true,
			ConsoleKeys: d.ConsoleKeys, Limits: cfg.Limits}, etcd)
		return err
	})
	if err != nil {
		return err
	}
	return d.Coordinator.WaitLeading(ctx)
}

// ComponentLabel is the pprof label key on every goroutine a dev cluster starts: "etcd",
// "etcd-client" (the client the nodes share), "region/<name>" or "coordinator". Goroutines
// inherit it from the one that started them, so a CPU profile of `quotad dev` (or of a bench
// that runs a cluster in process) tells the components apart: `go tool pprof -tagfocus` or
// `-tags`. Work a component hands to a goroutine another one started counts there: the
// shared etcd client's lease keep-alive loop, started by the first node to campaign, carries
// that node's label for every node's leases; the Go runtime's collector carries none.
const ComponentLabel = "component"

// inComponent runs start with its goroutine, and every goroutine it starts, labeled as the
// component name.
func inComponent(ctx context.Context, name string, start func(context.Context) error) error {
	var err error
	pprof.Do(ctx, pprof.Labels(ComponentLabel, name), func(ctx context.Context) { err = start(ctx) })
	return err
}

// startEdges starts cfg.Edges storefront edges in front of each region.
func (d *Dev) startEdges(ctx context.Context, cfg DevConfig) error {
	d.Edges = map[string][]*EdgeNode{}
	for i, n := range d.Regions {
		name := n.R.Name()
		for j := range cfg.Edges {
			err := inComponent(ctx, "edge/"+name, func(context.Context) error {
				e, err := StartEdge(EdgeConfig{Region: name, Upstream: []string{n.Addr()}, Listen: cfg.listen(1201 + MaxDevEdges*i + j),
					TicketKeys: cfg.TicketKeys, TLS: d.TLS, Limits: cfg.Limits, Logger: cfg.Logger})
				if err == nil {
					d.Edges[name] = append(d.Edges[name], e)
				}
				return err
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// Close stops everything, the edges and the coordinator first. Idempotent.
func (d *Dev) Close() {
	for _, es := range d.Edges {
		for _, e := range es {
			e.Close()
		}
	}
	if d.Coordinator != nil {
		d.Coordinator.Close()
	}
	for _, r := range d.Regions {
		r.Close()
	}
	for _, c := range d.nodeEtcd {
		if err := c.Close(); err != nil {
			slog.Debug("closing a node's etcd client", "err", err)
		}
	}
	d.nodeEtcd = nil
	if d.EtcdClient != nil {
		if err := d.EtcdClient.Close(); err != nil {
			slog.Debug("closing the etcd administrator's client", "err", err)
		}
		d.EtcdClient = nil
	}
	if d.Etcd != nil {
		d.Etcd.Close()
	}
}

// memberFiles names the embedded etcd's TLS files: node.crt serves clients and peers, and
// the client port accepts only the etcd users' certificates (nil when insecure).
func memberFiles(m *trust.Material, regions []string) *fencing.TLSFiles {
	if m.Insecure() {
		return nil
	}
	return &fencing.TLSFiles{CertFile: filepath.Join(m.Dir(), trust.NodeCert), KeyFile: filepath.Join(m.Dir(), trust.NodeKey),
		TrustedCAFile: filepath.Join(m.Dir(), trust.CACert), ClientCNs: fencing.Users(regions)}
}

// secureEtcd dials the embedded etcd as its administrator and, unless insecure, sets up its
// users and roles and turns authentication on (fencing.EnsureAuth) before any node dials it.
func (d *Dev) secureEtcd(ctx context.Context, clientURL string, regions []string) error {
	var err error
	if d.EtcdClient, err = d.dial(trust.EtcdRoot, clientURL); err != nil {
		return err
	}
	if d.TLS.Insecure() {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, etcdDialTimeout)
	defer cancel()
	return fencing.EnsureAuth(actx, d.EtcdClient, regions)
}

// etcdAs is a node's etcd client, as identity's etcd user; insecure, every node shares the
// administrator's plaintext client.
func (d *Dev) etcdAs(identity, clientURL string) (*fencing.Client, error) {
	if d.TLS.Insecure() {
		return d.EtcdClient, nil
	}
	c, err := d.dial(identity, clientURL)
	if err != nil {
		return nil, err
	}
	d.nodeEtcd = append(d.nodeEtcd, c)
	return c, nil
}

// dial connects to the embedded etcd as identity (plaintext when insecure).
func (d *Dev) dial(identity, clientURL string) (*fencing.Client, error) {
	if d.TLS.Insecure() {
		return fencing.Dial([]string{clientURL}, etcdDialTimeout)
	}
	cfg, err := d.TLS.EtcdClientConfig(identity)
	if err != nil {
		return nil, fmt.Errorf("certs-dir: %w", err)
	}
	return fencing.DialTLS([]string{clientURL}, etcdDialTimeout, cfg)
}
