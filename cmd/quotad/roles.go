package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

func addRegionTuning(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int("max-batch", 256, "most operations one region transaction commits")
	f.Duration("batch-window", 0, "how long a region's writer waits for more operations after the first (0: commit what is queued)")
	f.Duration("sweep-interval", time.Second, "how often expired holds are looked for")
	f.Duration("retain-closed", region.DefaultRetainClosed, "how long a region's leader keeps a closed hold whole in memory, so retries of it need no database read (afterwards only a digest of its key stays, and the hold moves to the archive table holds_closed)")
	f.Duration("standby-refresh", time.Second, "how often a region process that does not lead refreshes its copy of the region's state, so a takeover reads only what changed since (0: keep no copy; a takeover then loads every hold)")
	f.Int32("max-keys-per-user", region.DefaultMaxKeysPerUser, "most request keys one buyer may use in one sale at a region; past it a reserve with a new key is answered TOO_MANY_KEYS (RESOURCE_EXHAUSTED)")
	f.Bool("verify", false, "run expensive invariant checks after every region batch and crash on a breach (env QUOTA_VERIFY=1)")
}

func regionTuning(v *viper.Viper) (region.Config, error) {
	c := region.Config{Name: "placeholder", Writer: region.WriterConfig{MaxBatch: v.GetInt("max-batch"), BatchWindow: v.GetDuration("batch-window")},
		Sweep: region.SweepConfig{Interval: v.GetDuration("sweep-interval"), RetainClosed: v.GetDuration("retain-closed")}, Verify: v.GetBool("verify"),
		StandbyRefresh: v.GetDuration("standby-refresh"), MaxKeysPerUser: v.GetInt32("max-keys-per-user")}
	switch {
	case c.StandbyRefresh == 0: // no copy; in a region.Config 0 means the default
		c.StandbyRefresh = -1
	case c.StandbyRefresh < 0:
		return c, fmt.Errorf("standby-refresh %s: must not be negative (0: no copy)", c.StandbyRefresh)
	}
	if c.Sweep.RetainClosed <= 0 { // in a region.Config 0 means the default; on the command line it would surprise
		return c, fmt.Errorf("retain-closed %s: must be positive (default %s)", c.Sweep.RetainClosed, region.DefaultRetainClosed)
	}
	if c.MaxKeysPerUser <= 0 { // in a region.Config 0 means the default; on the command line it would surprise
		return c, fmt.Errorf("max-keys-per-user %d: must be positive (default %d)", c.MaxKeysPerUser, region.DefaultMaxKeysPerUser)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	c.Name = ""
	return c, nil
}

func regionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "region",
		Args:  cobra.NoArgs, // a stray word (a flag without its dashes) must not start a server on defaults
		Short: "Run one region server (leader or standby, elected in etcd)",
		Example: `  quotad region --name us --listen 127.0.0.1:7401 --db-url postgres://quota:quota@127.0.0.1:5432/quota_region_us \
    --etcd https://127.0.0.1:2379 --certs-dir certs`,
		RunE: runRegion,
	}
	f := cmd.Flags()
	f.String("name", "", "region name (required)")
	f.String("listen", "127.0.0.1:7401", "gRPC address")
	f.String("advertise", "", "the gRPC address (host:port) published in etcd for clients and the coordinator to reach this process,\n"+
		"when it differs from --listen (a pod's IP, a NAT); empty: the address --listen bound")
	f.String("http-listen", "", "the storefront HTTP/JSON edge's address (docs/storefront.md), which also serves the region's\n"+
		"Prometheus metrics at /metrics, e.g. 127.0.0.1:8401; empty: none")
	f.String("room-listen", "", "the waiting-room page's public HTTPS address, for shoppers' browsers: a server certificate\n"+
		"only, no client certificate (docs/storefront.md, \"The waiting-room page\"); needs --ticket-keys;\n"+
		"e.g. 0.0.0.0:8501; empty: none")
	f.String("ticket-keys", "", "the cluster's ticket key file (quotactl ticket-keys create); needed to serve sales with a\n"+
		"waiting room: without it, their admissions and reservations are refused")
	f.String("db-url", "", "URL of the region's own database, which must exist (required; unlike --pg-url of quotad dev, nothing is created)")
	f.StringSlice("etcd", nil, "etcd endpoints (default https://127.0.0.1:2379; http:// with --insecure); list the region's own\n"+
		"member first: buyer bindings are written through it first, the others when it fails")
	f.Duration("lease-ttl", 5*time.Second, "etcd lease of the region's leadership")
	addRegionTuning(cmd)
	addSecurityFlags(cmd, "(required unless --insecure)")
	addConnectionFlags(cmd)
	return cmd
}

// RegionProcessConfig is `quotad region`'s configuration.
type RegionProcessConfig struct {
	Node cluster.RegionConfig
	Etcd []string
}

// Validate checks the configuration, naming the bad key.
func (c *RegionProcessConfig) Validate() error {
	if why := transfer.CheckRegion(c.Node.Region.Name); why != "" {
		return fmt.Errorf("name %q: %s", c.Node.Region.Name, why)
	}
	if c.Node.DBURL == "" {
		return fmt.Errorf("db-url: must be set")
	}
	if len(c.Etcd) == 0 {
		return fmt.Errorf("etcd: name at least one endpoint")
	}
	if c.Node.LeaseTTL < time.Second {
		return fmt.Errorf("lease-ttl %s: must be at least 1s", c.Node.LeaseTTL)
	}
	if c.Node.RoomListen != "" && c.Node.TicketKeys == "" {
		return fmt.Errorf("room-listen %s: the waiting-room page needs --ticket-keys", c.Node.RoomListen)
	}
	return checkAdvertise(c.Node.Advertise)
}

// checkAdvertise refuses an --advertise address others could not dial: it must be host:port
// with a host that is not a wildcard (0.0.0.0, ::) and a port from 1 to 65535. "" is none.
func checkAdvertise(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("advertise %q: want host:port: %v", addr, err)
	}
	if host == "" {
		return fmt.Errorf("advertise %q: the host is empty: name the address others reach this process at", addr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("advertise %q: %s is a wildcard, not an address others can reach", addr, host)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("advertise %q: port %q: want 1 to 65535", addr, port)
	}
	return nil
}

func runRegion(cmd *cobra.Command, _ []string) error {
	v, log, err := settings(cmd)
	if err != nil {
		return badUsage(err)
	}
	rc, err := regionTuning(v)
	if err != nil {
		return badUsage(err)
	}
	rc.Name, rc.Logger = v.GetString("name"), log
	tlsm, err := security(v, log)
	if err != nil {
		return badUsage(err)
	}
	limits, err := connectionLimits(v)
	if err != nil {
		return badUsage(err)
	}
	cfg := RegionProcessConfig{Node: cluster.RegionConfig{Region: rc, Listen: v.GetString("listen"), Advertise: v.GetString("advertise"), DBURL: v.GetString("db-url"),
		LeaseTTL: v.GetDuration("lease-ttl"), TLS: tlsm, Logger: log, HTTPListen: v.GetString("http-listen"),
		RoomListen: v.GetString("room-listen"), TicketKeys: v.GetString("ticket-keys"), Limits: limits}, Etcd: etcdEndpoints(v, tlsm)}
	if err := cfg.Validate(); err != nil {
		return badUsage(err)
	}
	etcdTLSConfig, err := etcdTLS(cfg.Etcd, tlsm, trust.EtcdRegion(rc.Name))
	if err != nil {
		return badUsage(err)
	}
	ctx, stop := signalContext()
	defer stop()
	etcd, err := fencing.DialTLS(cfg.Etcd, 5*time.Second, etcdTLSConfig)
	if err != nil {
		return err
	}
	defer etcd.Close()
	if near := nearEtcd(cfg.Etcd, etcdTLSConfig, log); near != nil {
		defer near.Close()
		cfg.Node.NearEtcd = near
	}
	n, err := cluster.StartRegion(ctx, cfg.Node, etcd)
	if err != nil {
		return err
	}
	defer n.Close()
	fmt.Printf("quotad region %s: %s\n", rc.Name, n.Addr())
	<-ctx.Done()
	return nil
}

func coordinatorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "coordinator",
		Args:  cobra.NoArgs, // a stray word (a flag without its dashes) must not start a server on defaults
		Short: "Run a coordinator (leader or standby, elected in etcd)",
		Example: `  quotad coordinator --listen 127.0.0.1:7400 --db-url postgres://quota:quota@127.0.0.1:5432/quota_coordinator \
    --region us=127.0.0.1:7401=postgres://quota:quota@127.0.0.1:5432/quota_region_us \
    --etcd https://127.0.0.1:2379 --certs-dir certs`,
		RunE: runCoordinator,
	}
	f := cmd.Flags()
	f.String("listen", "127.0.0.1:7400", "gRPC address")
	f.String("advertise", "", "the gRPC address (host:port) published in etcd for clients and the coordinator to reach this process,\n"+
		"when it differs from --listen (a pod's IP, a NAT); empty: the address --listen bound")
	f.String("http-listen", "", "address of the coordinator's HTTP listener: its Prometheus metrics (GET /metrics) and, with\n"+
		"--console-keys or --insecure, the web console (/console/), e.g. 127.0.0.1:8400; empty: none")
	f.String("console-keys", "", "the web console's key file (quotactl console keys create), whose keys verify the console's\n"+
		"login tokens (quotactl console token); empty: no console unless --insecure (docs/console.md)")
	f.String("db-url", "", "URL of the coordinator's own database, the ledger, which must exist (required; unlike --pg-url of quotad dev, nothing is created)")
	// StringArray, not StringSlice: a multi-host database URL (h1:p1,h2:p2) has commas.
	f.StringArray("region", nil, "a region as name=grpc-address=database-url (required; repeat per region; the URL may\n"+
		"name several hosts, postgres://u@h1:p1,h2:p2/db?target_session_attrs=read-write)")
	f.StringSlice("etcd", nil, "etcd endpoints (default https://127.0.0.1:2379; http:// with --insecure)")
	f.Duration("lease-ttl", 5*time.Second, "etcd lease of the coordinator's leadership")
	f.Duration("strand-after", 30*time.Second, "flag a transfer stranded once a step has failed and it was recorded longer ago than this")
	addAuditFlag(cmd)
	addRebalanceFlags(cmd)
	addSecurityFlags(cmd, "(required unless --insecure; client.coordinator.crt is used to call the regions)")
	addConnectionFlags(cmd)
	return cmd
}

// CoordinatorProcessConfig is `quotad coordinator`'s configuration.
type CoordinatorProcessConfig struct {
	Node cluster.CoordinatorConfig
	Etcd []string
}

// Validate checks the configuration, naming the bad key.
func (c *CoordinatorProcessConfig) Validate() error {
	if c.Node.DBURL == "" {
		return fmt.Errorf("db-url: must be set")
	}
	if len(c.Node.Regions) == 0 {
		return fmt.Errorf("--region: required: name at least one region as name=grpc-address=database-url")
	}
	if len(c.Etcd) == 0 {
		return fmt.Errorf("etcd: name at least one endpoint")
	}
	if c.Node.AuditRetention <= 0 {
		return fmt.Errorf("audit-retention %s: must be positive", c.Node.AuditRetention)
	}
	if c.Node.AuditInterval < 0 {
		return fmt.Errorf("audit-interval %s: must not be negative (0: no continuous audit)", c.Node.AuditInterval)
	}
	return checkAdvertise(c.Node.Advertise)
}

// addRebalanceFlags adds the coordinator's automatic rebalancer's flags (quotad coordinator
// and dev).
func addRebalanceFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Bool("auto-rebalance", true, "the leading coordinator moves stock of the sales created with --rebalance auto (the default) toward the regions that will run out first; false: only operators move stock")
	f.Duration("rebalance-every", coordinator.DefaultRebalanceEvery, "how often the automatic rebalancer plans")
	f.Duration("rebalance-window", coordinator.DefaultRebalanceWindow, "the automatic rebalancer's demand: units reserved at each region over this window")
	f.Duration("rebalance-horizon", coordinator.DefaultRebalanceHorizon, "the automatic rebalancer keeps at each region what it would sell at its recent rate over this horizon")
	f.Int64("rebalance-min-units", coordinator.DefaultRebalanceMinUnits, "the automatic rebalancer's smallest move (near sell-out, a quiet region's last units move whatever their number)")
	f.Int("rebalance-max-in-flight", coordinator.DefaultRebalanceMaxInFlight, "the automatic rebalancer starts no transfer of a SKU that has this many unfinished (1..100)")
	f.Duration("rebalance-cooldown", coordinator.DefaultRebalanceCooldown, "the automatic rebalancer waits this long after moving a SKU's units before moving that SKU's again")
}

// checkRebalanceFlags refuses an automatic rebalancer setting out of its range, naming the
// flag (each has a default, so a 0 was typed).
func checkRebalanceFlags(v *viper.Viper) error {
	for _, f := range []string{"rebalance-window", "rebalance-horizon", "rebalance-cooldown"} {
		if d := v.GetDuration(f); d <= 0 {
			return fmt.Errorf("%s %s: must be positive", f, d)
		}
	}
	if d := v.GetDuration("rebalance-every"); d < 50*time.Millisecond {
		return fmt.Errorf("rebalance-every %s: must be at least 50ms (each round reads every region)", d)
	}
	if n := v.GetInt64("rebalance-min-units"); n < 1 {
		return fmt.Errorf("rebalance-min-units %d: must be at least 1", n)
	}
	if n := v.GetInt("rebalance-max-in-flight"); n < 1 || n > 100 {
		return fmt.Errorf("rebalance-max-in-flight %d: must be 1..100", n)
	}
	return nil
}

// rebalanceConfig reads addRebalanceFlags' flags.
func rebalanceConfig(v *viper.Viper) coordinator.AutoRebalance {
	return coordinator.AutoRebalance{Enabled: v.GetBool("auto-rebalance"), Every: v.GetDuration("rebalance-every"),
		Policy: transfer.Policy{Window: v.GetDuration("rebalance-window"), Horizon: v.GetDuration("rebalance-horizon"),
			MinUnits: transfer.Units(v.GetInt64("rebalance-min-units"))},
		MaxInFlight: v.GetInt("rebalance-max-in-flight"), Cooldown: v.GetDuration("rebalance-cooldown")}
}

// addAuditFlag adds the coordinator's --audit-interval and --audit-retention (quotad
// coordinator and dev).
func addAuditFlag(cmd *cobra.Command) {
	cmd.Flags().Duration("audit-interval", coordinator.DefaultAuditInterval,
		"how often the leading coordinator audits every sale and pauses each SKU whose conservation (I1) is broken in every region (0: never)")
	cmd.Flags().Duration("audit-retention", coordinator.DefaultAuditRetention,
		"how long the ledger keeps each round of the continuous audit (quotactl audit history); older rounds are pruned")
}

func parseRegions(specs []string) ([]cluster.RegionEndpoint, error) {
	var out []cluster.RegionEndpoint
	for _, s := range specs {
		parts := strings.SplitN(s, "=", 3)
		if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
			return nil, fmt.Errorf("region %q: want name=grpc-address=database-url", s)
		}
		if why := transfer.CheckRegion(parts[0]); why != "" {
			return nil, fmt.Errorf("region %q: name %s", s, why)
		}
		out = append(out, cluster.RegionEndpoint{Name: parts[0], Addr: parts[1], DBURL: parts[2]})
	}
	return out, nil
}

func runCoordinator(cmd *cobra.Command, _ []string) error {
	v, log, err := settings(cmd)
	if err != nil {
		return badUsage(err)
	}
	regions, err := parseRegions(v.GetStringSlice("region"))
	if err != nil {
		return badUsage(err)
	}
	tlsm, err := security(v, log)
	if err != nil {
		return badUsage(err)
	}
	if err := checkRebalanceFlags(v); err != nil {
		return badUsage(err)
	}
	limits, err := connectionLimits(v)
	if err != nil {
		return badUsage(err)
	}
	cfg := CoordinatorProcessConfig{Node: cluster.CoordinatorConfig{Listen: v.GetString("listen"), Advertise: v.GetString("advertise"), DBURL: v.GetString("db-url"),
		Regions: regions, LeaseTTL: v.GetDuration("lease-ttl"), StrandAfter: v.GetDuration("strand-after"), Logger: log,
		AuditInterval: v.GetDuration("audit-interval"), AuditRetention: v.GetDuration("audit-retention"), Auto: rebalanceConfig(v), FollowLeaders: true, TLS: tlsm, HTTPListen: v.GetString("http-listen"),
		ConsoleKeys: v.GetString("console-keys"), Limits: limits}, Etcd: etcdEndpoints(v, tlsm)}
	if err := cfg.Validate(); err != nil {
		return badUsage(err)
	}
	etcdTLSConfig, err := etcdTLS(cfg.Etcd, tlsm, trust.EtcdCoordinator)
	if err != nil {
		return badUsage(err)
	}
	ctx, stop := signalContext()
	defer stop()
	etcd, err := fencing.DialTLS(cfg.Etcd, 5*time.Second, etcdTLSConfig)
	if err != nil {
		return err
	}
	defer etcd.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := cluster.StartCoordinator(sctx, cfg.Node, etcd)
	if err != nil {
		return err
	}
	defer n.Close()
	fmt.Printf("quotad coordinator: %s", n.Addr())
	if a := n.HTTPAddr(); a != "" {
		fmt.Printf(", metrics %s", a)
		if cfg.Node.ConsoleKeys != "" || tlsm.Insecure() {
			fmt.Printf(", console %s%s", a, coordhttp.Prefix)
		}
	}
	fmt.Println()
	<-ctx.Done()
	return nil
}

// nearEtcd is a client of the first of several etcd endpoints only, the region's own member,
// through which the region writes its buyer bindings first; nil with one endpoint. It does
// not wait for the member: one that is down is found out by the bindings written through it,
// which then go through every member for a while (fencing.NewBinderNear).
func nearEtcd(endpoints []string, cfg *tls.Config, log *slog.Logger) *fencing.Client {
	if len(endpoints) < 2 {
		return nil
	}
	near, err := fencing.DialTLSLazy(endpoints[:1], 5*time.Second, cfg)
	if err != nil {
		log.Warn("no client of the first etcd endpoint: buyer bindings go through every member", "endpoint", endpoints[0], "err", err)
		return nil
	}
	return near
}
