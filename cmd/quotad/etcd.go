package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/spf13/cobra"
)

func etcdCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run one member of a static multi-member etcd cluster (deploy/local runs three)",
		Long: `etcd runs one member of a static etcd cluster (real etcd, embedded in this process) until
SIGINT or SIGTERM. Every member is started with the same --initial-cluster. A member serves
clients once a quorum of the cluster is up, so start the others too. A member whose
--data-dir already holds data restarts from it (initial cluster state "existing").
With --certs-dir it serves clients and peers over TLS (https:// URLs) with node.crt and
node.key, and requires a client certificate signed by ca.crt on both; --insecure serves
plaintext (http:// URLs).

With --certs-dir, etcd's authentication is on: a client is the etcd user its certificate's
common name names, and may touch only the keys its role grants. Once the cluster has a quorum,
every member makes sure (with etcd.root.crt) that the users and roles exist: quota/coordinator,
and quota/region/<name> for each of --regions; a region added later is added by restarting the
members with it in --regions. Every other certificate of the CA (a storefront's, an operator's,
node.crt) may do nothing in etcd. Make the certificates with quotactl cert create-etcd.
etcd's JSON gateway (/v3/... over HTTP) is off unless --grpc-gateway: it cannot authenticate by
certificate, and a web page may post to it.`,
		Example: `  quotad etcd --name e1 --data-dir .cluster/etcd1 --certs-dir .cluster/certs \
    --client-url https://127.0.0.1:7581 --peer-url https://127.0.0.1:7591 \
    --initial-cluster e1=https://127.0.0.1:7591,e2=https://127.0.0.1:7592,e3=https://127.0.0.1:7593 \
    --regions us,eu,ap`,
		Args: cobra.NoArgs,
		RunE: runEtcd,
	}
	f := cmd.Flags()
	f.String("name", "", "member name, as in --initial-cluster (required)")
	f.String("data-dir", "", "the member's data directory (required)")
	f.String("client-url", "", "URL clients reach this member at (listened on and advertised; default https://127.0.0.1:2379, http:// with --insecure)")
	f.String("peer-url", "", "URL the other members reach this member at (listened on and advertised; default https://127.0.0.1:2380, http:// with --insecure)")
	f.String("listen-peer-url", "", "where the member listens for its peers when a proxy serves --peer-url in front of it\n"+
		"(deploy/local's --wan delay links); empty: --peer-url")
	f.String("initial-cluster", "", "every member as name=peer-url, comma-separated (required; the same on every member)")
	f.String("cluster-token", "quota-local", "initial cluster token: tells clusters apart when they bootstrap")
	f.String("etcd-log-level", "warn", "etcd's own log level: debug, info, warn, error")
	f.StringSlice("regions", nil, "the regions whose processes get an etcd user and role (required unless --insecure; the same on every member)")
	f.Bool("grpc-gateway", false, "serve etcd's JSON gateway (/v3/... over HTTP); it cannot authenticate by certificate")
	addSecurityFlags(cmd, "(required unless --insecure; node.crt serves clients and peers and is presented to peers)")
	return cmd
}

// EtcdProcessConfig is `quotad etcd`'s configuration.
type EtcdProcessConfig struct {
	Member fencing.MemberConfig
	// Regions get an etcd user and role each (fencing.EnsureAuth); unused when insecure.
	Regions []string
	// Root is the administrator's TLS, to set up authentication (nil when insecure).
	Root *tls.Config
}

// Validate checks the configuration, naming the bad key.
func (c *EtcdProcessConfig) Validate() error {
	if c.Member.InitialCluster == "" {
		return fmt.Errorf("initial-cluster: must be set, as name=peer-url,name=peer-url,...")
	}
	for flag, u := range map[string]string{"client-url": c.Member.ClientURL, "peer-url": c.Member.PeerURL, "listen-peer-url": c.Member.ListenPeerURL} {
		if c.Member.TLS == nil && strings.HasPrefix(u, "https://") {
			return fmt.Errorf("%s %s: https:// needs --certs-dir (with --insecure the member serves http://)", flag, u)
		}
		if c.Member.TLS != nil && strings.HasPrefix(u, "http://") {
			return fmt.Errorf("%s %s: with --certs-dir the member serves TLS: want https:// (or pass --insecure)", flag, u)
		}
	}
	if c.Member.TLS != nil {
		if len(c.Regions) == 0 {
			return fmt.Errorf("regions: name the regions whose processes may use etcd (with --certs-dir, etcd authenticates every client)")
		}
		for _, r := range c.Regions {
			if err := trust.CheckEtcdIdentity(trust.EtcdRegion(r)); err != nil {
				return fmt.Errorf("regions: %w", err)
			}
		}
	}
	return c.Member.Validate()
}

// memberTLS names the files of an etcd member's TLS in the certificates directory (nil
// for --insecure).
func memberTLS(m *trust.Material) *fencing.TLSFiles {
	if m.Insecure() {
		return nil
	}
	return &fencing.TLSFiles{CertFile: filepath.Join(m.Dir(), trust.NodeCert), KeyFile: filepath.Join(m.Dir(), trust.NodeKey),
		TrustedCAFile: filepath.Join(m.Dir(), trust.CACert)}
}

// orDefaultURL is u, or hostPort as an https:// URL (http:// when insecure) when u is unset.
func orDefaultURL(u, hostPort string, m *trust.Material) string {
	switch {
	case u != "":
		return u
	case m.Insecure():
		return "http://" + hostPort
	default:
		return "https://" + hostPort
	}
}

func runEtcd(cmd *cobra.Command, _ []string) error {
	v, log, err := settings(cmd)
	if err != nil {
		return badUsage(err)
	}
	tlsm, err := security(v, log)
	if err != nil {
		return badUsage(err)
	}
	cfg := EtcdProcessConfig{Member: fencing.MemberConfig{Name: v.GetString("name"), Dir: v.GetString("data-dir"),
		ClientURL: v.GetString("client-url"), PeerURL: v.GetString("peer-url"),
		ListenPeerURL: v.GetString("listen-peer-url"), InitialCluster: v.GetString("initial-cluster"),
		Token: v.GetString("cluster-token"), LogLevel: v.GetString("etcd-log-level"), TLS: memberTLS(tlsm),
		Gateway: v.GetBool("grpc-gateway")}, Regions: v.GetStringSlice("regions")}
	if !tlsm.Insecure() {
		cfg.Member.TLS.ClientCNs = fencing.ClientCNs(cfg.Regions, cfg.Member.Gateway)
		if cfg.Root, err = tlsm.EtcdClientConfig(trust.EtcdRoot); err != nil {
			return badUsage(fmt.Errorf("certs-dir: %w", err))
		}
	}
	cfg.Member.ClientURL = orDefaultURL(cfg.Member.ClientURL, "127.0.0.1:2379", tlsm)
	cfg.Member.PeerURL = orDefaultURL(cfg.Member.PeerURL, "127.0.0.1:2380", tlsm)
	if err := cfg.Validate(); err != nil {
		return badUsage(err)
	}
	ctx, stop := signalContext()
	defer stop()
	state := "new"
	if fencing.HasMemberData(cfg.Member.Dir) {
		state = "existing"
	}
	log.Info("etcd member starting; it serves once a quorum of the cluster is up", "name", cfg.Member.Name,
		"client", cfg.Member.ClientURL, "peer", cfg.Member.PeerURL, "cluster", cfg.Member.InitialCluster, "state", state)
	m, err := fencing.StartMember(ctx, cfg.Member)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("etcd member stopped before it was ready", "name", cfg.Member.Name)
			return nil
		}
		return err
	}
	defer m.Close()
	secured := make(chan struct{})
	go func() { // owned: waited for below, ends with ctx
		defer close(secured)
		secureMember(ctx, cfg, log)
	}()
	defer func() { <-secured }()
	fmt.Printf("quotad etcd %s: clients %s, peers %s (%s)\n", cfg.Member.Name, cfg.Member.ClientURL, cfg.Member.PeerURL, m.State)
	select {
	case <-ctx.Done():
		log.Info("etcd member stopping", "name", cfg.Member.Name)
		return nil
	case err := <-m.Err():
		return fmt.Errorf("etcd member %s: %w", cfg.Member.Name, err)
	case <-m.Done():
		return fmt.Errorf("etcd member %s stopped on its own (see the log above)", cfg.Member.Name)
	}
}

// secureMember makes sure, as etcd's administrator, that the cluster's users and roles
// exist and authentication is on (fencing.EnsureAuth). Every member does it at every start:
// it is idempotent, and the first member to get there does the work. A failure (a quorum
// lost for a moment, an expired etcd.root.crt) is logged and tried again every few seconds
// while the member serves: a member does not stop serving its peers over it. Until it is done
// on a new cluster, the client port still accepts only the etcd users' certificates.
func secureMember(ctx context.Context, cfg EtcdProcessConfig, log *slog.Logger) {
	if cfg.Root == nil {
		return
	}
	for attempt := 1; ; attempt++ {
		err := ensureAuthOnce(ctx, cfg)
		if err == nil {
			log.Info("etcd authentication is on", "name", cfg.Member.Name, "regions", cfg.Regions)
			return
		}
		if ctx.Err() != nil {
			return
		}
		log.Error("setting up etcd's users and roles failed; trying again", "name", cfg.Member.Name, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

// ensureAuthOnce dials the member as root and runs fencing.EnsureAuth once.
func ensureAuthOnce(ctx context.Context, cfg EtcdProcessConfig) error {
	c, err := fencing.DialTLS([]string{cfg.Member.ClientURL}, 10*time.Second, cfg.Root)
	if err != nil {
		return fmt.Errorf("dial as root: %w", err)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = fencing.EnsureAuth(actx, c, cfg.Regions)
	if cerr := c.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close the root client: %w", cerr)
	}
	return err
}
