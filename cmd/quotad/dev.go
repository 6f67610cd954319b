package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

func devCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Args:  cobra.NoArgs, // a stray word (a flag without its dashes) must not start a server on defaults
		Short: "Run an embedded etcd, a coordinator and regions in one process",
		Long: `Run the whole system in one process for development and demos.

The coordinator listens on 127.0.0.1:<base-port> (7400) and the regions on the next ports
in the order given (us 7401, eu 7402, ap 7403); each region's storefront HTTP/JSON edge
(docs/storefront.md) on base-port+1001 on (us 8401, eu 8402, ap 8403), each also serving
the region's Prometheus metrics at /metrics; the coordinator's metrics are on base-port+1000
(8400), which also serves the web console at /console/ (docs/console.md): log in with a token
from quotactl console token --role operator|auditor, signed with <data-dir>/console.keys
(created when missing; no login under --insecure). The embedded etcd serves clients on base-port+90. Waiting-room tickets are signed with the keys in
<data-dir>/tickets.keys, created when missing. Each role has its own database on the PostgreSQL server of --pg-url,
created when missing: <db-prefix>_coordinator, <db-prefix>_region_<name>.

Every server serves TLS and requires a client certificate whose role may make the call.
What is missing of the certificates is created at start under --certs-dir (default
<data-dir>/certs): ca.crt and ca.key, node.crt/node.key, and client.<role>.crt/.key for the
roles coordinator, storefront, operator and auditor, and etcd.<identity>.crt/.key for etcd's
users (root, coordinator, region-<name>). A node or role certificate within 30 days of its end,
expired, or not signed by ca.crt is made again from the same CA; an expired CA is made again
with all of them. quotactl finds them in .dev/certs by default.

The embedded etcd serves TLS on loopback, requires a client certificate, and has its
authentication on: each region and the coordinator reach it as their own etcd user and may
touch only their own keys; every other certificate may do nothing there. Inspect it as root:
  etcdctl --endpoints https://127.0.0.1:7490 --cacert .dev/certs/ca.crt \
    --cert .dev/certs/etcd.root.crt --key .dev/certs/etcd.root.key get --prefix /quota/
Its JSON gateway is off unless --grpc-gateway. --insecure runs everything plaintext with no
roles, etcd included.`,
		Example: `  quotad dev
  quotad dev --regions us,eu --pg-url postgres://quota:quota@127.0.0.1:5432/postgres --data-dir .dev`,
		RunE: runDev,
	}
	f := cmd.Flags()
	f.StringSlice("regions", []string{"us", "eu", "ap"}, "region names, in port order")
	f.String("pg-url", "postgres://quota:quota@127.0.0.1:5432/postgres", "URL of the PostgreSQL server on which to create the databases (--db-prefix); its own database is only connected to")
	f.String("data-dir", ".dev", "directory for the embedded etcd's data")
	f.String("db-prefix", "quota", "prefix of the database names")
	f.String("host", "127.0.0.1", "address every server binds")
	f.Int("base-port", 7400, "coordinator port; regions use the next ports; 0 picks free ports")
	f.Duration("lease-ttl", 5*time.Second, "etcd lease of every leader")
	f.Int("edges", 0, fmt.Sprintf("storefront edges (quotad edge) to run in front of each region, 0..%d: the i-th region's j-th edge\n"+
		"serves the storefront HTTP API on base-port+1201+%d*i+j (us 8601, 8602, ...), answering polls of the waiting line\n"+
		"itself and forwarding the rest to the region's leader (docs/storefront.md, \"Edges\")", cluster.MaxDevEdges, cluster.MaxDevEdges))
	f.Bool("grpc-gateway", false, "serve the embedded etcd's JSON gateway (/v3/... over HTTP); it cannot authenticate by certificate")
	addAuditFlag(cmd)
	addRebalanceFlags(cmd)
	addRegionTuning(cmd)
	addSecurityFlags(cmd, "(default <data-dir>/certs; what is missing is created)")
	addConnectionFlags(cmd)
	return cmd
}

func devConfig(v *viper.Viper) (cluster.DevConfig, error) {
	rc, err := regionTuning(v)
	if err != nil {
		return cluster.DevConfig{}, err
	}
	if err := checkRebalanceFlags(v); err != nil {
		return cluster.DevConfig{}, err
	}
	limits, err := connectionLimits(v)
	if err != nil {
		return cluster.DevConfig{}, err
	}
	c := cluster.DevConfig{
		Regions: v.GetStringSlice("regions"), PGURL: v.GetString("pg-url"), DBPrefix: v.GetString("db-prefix"),
		DataDir: v.GetString("data-dir"), Host: v.GetString("host"), BasePort: v.GetInt("base-port"),
		LeaseTTL: v.GetDuration("lease-ttl"), Region: rc, CertsDir: v.GetString("certs-dir"), Insecure: v.GetBool("insecure"),
		AuditInterval: v.GetDuration("audit-interval"), AuditRetention: v.GetDuration("audit-retention"), Auto: rebalanceConfig(v), Limits: limits,
		EtcdGateway: v.GetBool("grpc-gateway"), Edges: v.GetInt("edges"),
	}
	return c, c.Validate()
}

func runDev(cmd *cobra.Command, _ []string) error {
	v, log, err := settings(cmd)
	if err != nil {
		return badUsage(err)
	}
	cfg, err := devConfig(v)
	if err != nil {
		return badUsage(err)
	}
	cfg.Logger, cfg.Region.Logger = log, log
	if cfg.Insecure {
		fmt.Fprint(os.Stderr, insecureBanner)
		log.Warn("running insecure: plaintext, no client certificates, no authorization")
	}
	ctx, stop := signalContext()
	defer stop()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d, err := cluster.StartDev(sctx, cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Printf("quotad dev: coordinator %s", d.Coordinator.Addr())
	for _, r := range d.Regions {
		fmt.Printf(", region %s %s", r.R.Name(), r.Addr())
	}
	fmt.Printf(", etcd %s\n", d.Etcd.ClientURL)
	scheme := "https"
	if d.TLS == nil {
		scheme = "http"
	}
	fmt.Printf("quotad dev: storefront HTTP")
	for _, r := range d.Regions {
		fmt.Printf(", region %s %s://%s", r.R.Name(), scheme, r.HTTPAddr())
	}
	made := ""
	if d.TicketKeysMade {
		made = " (created)"
	}
	fmt.Printf("; ticket keys %s%s\n", d.TicketKeys, made)
	for _, r := range d.Regions {
		for _, e := range d.Edges[r.R.Name()] {
			fmt.Printf("quotad dev: storefront edge of region %s %s://%s\n", r.R.Name(), scheme, e.Addr())
		}
	}
	fmt.Printf("quotad dev: waiting-room pages (no client certificate)")
	for _, r := range d.Regions {
		fmt.Printf(", region %s %s://%s/room/<sale>", r.R.Name(), scheme, r.RoomAddr())
	}
	fmt.Println()
	fmt.Printf("quotad dev: metrics at %s://%s%s (coordinator)", scheme, d.Coordinator.HTTPAddr(), trust.MetricsPath)
	for _, r := range d.Regions {
		fmt.Printf(", %s://%s%s (region %s)", scheme, r.HTTPAddr(), trust.MetricsPath, r.R.Name())
	}
	fmt.Println()
	printConsole(d, scheme)
	if d.TLS != nil {
		fmt.Printf("quotad dev: mutual TLS with certificates in %s", d.TLS.Dir())
		if len(d.CertsMade) > 0 {
			fmt.Printf(" (created %s)", strings.Join(d.CertsMade, ", "))
		}
		fmt.Println()
	}
	<-ctx.Done()
	fmt.Println("quotad dev: shutting down")
	return nil
}

// printConsole says where the web console is and how to log in.
func printConsole(d *cluster.Dev, scheme string) {
	fmt.Printf("quotad dev: console at %s://%s%s", scheme, d.Coordinator.HTTPAddr(), coordhttp.Prefix)
	if d.TLS == nil {
		fmt.Println(" (no login: --insecure)")
		return
	}
	made := ""
	if d.ConsoleKeysMade {
		made = ", created"
	}
	fmt.Printf(" (keys %s%s); log in with the token of: quotactl console token --role operator --console-keys %s\n", d.ConsoleKeys, made, d.ConsoleKeys)
}
