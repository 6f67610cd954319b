package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

// addSecurityFlags adds --certs-dir and --insecure to a server command. certsHelp says where
// the directory defaults to.
func addSecurityFlags(cmd *cobra.Command, certsHelp string) {
	f := cmd.Flags()
	f.String("certs-dir", "", "directory of the cluster's certificates: ca.crt, node.crt/node.key, client.<role>.crt/.key "+certsHelp)
	f.Bool("insecure", false, "serve plaintext with no client certificates and no roles: anyone who reaches a port may do anything (development only)")
}

// addConnectionFlags adds the bounds on connections every listener of a server command has
// (rpcserve.Limits; docs/security.md, "Connection exhaustion").
func addConnectionFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	d := rpcserve.DefaultLimits
	f.Int("max-connections", d.MaxConnections, "most open connections of each listener (gRPC, HTTP); more are closed as they arrive")
	f.Int("max-connections-per-ip", d.MaxConnectionsPerIP, "most open connections from one client address (an IPv6 address's /64) on each listener;\n"+
		"more are closed as they arrive (counted in quota_connections_refused_total{limit=\"per_address\"}).\n"+
		"Raise it for many clients behind one address (a NAT, a proxy) or a load test from one host")
	f.Int("max-connections-per-cert", d.MaxConnectionsPerCert, "most open connections presenting one client certificate (by its fingerprint), from any\n"+
		"address, on each listener; more are closed after their handshake (limit=\"per_certificate\")")
}

// connectionLimits reads addConnectionFlags' flags, refusing a bound out of its range.
func connectionLimits(v *viper.Viper) (rpcserve.Limits, error) {
	lim := rpcserve.Limits{MaxConnections: v.GetInt("max-connections"), MaxConnectionsPerIP: v.GetInt("max-connections-per-ip"),
		MaxConnectionsPerCert: v.GetInt("max-connections-per-cert")}
	if lim.MaxConnections < 1 || lim.MaxConnections > maxConnectionsFlag {
		return lim, fmt.Errorf("max-connections %d: must be 1..%d", lim.MaxConnections, maxConnectionsFlag)
	}
	for _, b := range []struct {
		flag string
		n    int
	}{{"max-connections-per-ip", lim.MaxConnectionsPerIP}, {"max-connections-per-cert", lim.MaxConnectionsPerCert}} {
		if b.n < 1 || b.n > lim.MaxConnections {
			return lim, fmt.Errorf("%s %d: must be 1..max-connections (%d)", b.flag, b.n, lim.MaxConnections)
		}
	}
	return lim, nil
}

// maxConnectionsFlag bounds --max-connections: each connection costs a file descriptor and
// its buffers.
const maxConnectionsFlag = 65536

// insecureBanner is what a server prints, to stderr and its log, when it runs without TLS.
const insecureBanner = `
*** WARNING: running --insecure: plaintext, no client certificates, no roles. ***
*** Anyone who can reach these ports can create, move or destroy stock.        ***
`

// security loads the certificates a server command names, or returns nil for --insecure
// after saying so loudly. An expired ca.crt or node.crt fails it, naming the file; a
// certificate of the directory within 30 days of its end (or refused) is a warning.
func security(v *viper.Viper, log *slog.Logger) (*trust.Material, error) {
	if v.GetBool("insecure") {
		fmt.Fprint(os.Stderr, insecureBanner)
		log.Warn("running insecure: plaintext, no client certificates, no authorization")
		return nil, nil
	}
	dir := v.GetString("certs-dir")
	if dir == "" {
		return nil, fmt.Errorf("certs-dir: must be set (the directory of ca.crt and node.crt; make them with quotactl cert), or pass --insecure")
	}
	m, err := trust.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("certs-dir: %w", err)
	}
	if _, err := m.ServerConfig(); err != nil {
		return nil, fmt.Errorf("certs-dir: %w", err)
	}
	cluster.WarnCertificates(dir, time.Now(), log)
	return m, nil
}

// etcdTLS is a server's TLS config for etcd at endpoints, as the etcd user of identity
// (trust.EtcdRegion, trust.EtcdCoordinator): its etcd.<identity>.crt as the client
// certificate and ca.crt as the roots. Insecure (nil m), the endpoints must be http:// and
// the config is nil; with certificates they must be https://: etcd authenticates each
// process by its certificate and lets it touch only its own keys (fencing.EnsureAuth).
func etcdTLS(endpoints []string, m *trust.Material, identity string) (*tls.Config, error) {
	for _, ep := range endpoints {
		secure := strings.HasPrefix(ep, "https://")
		switch {
		case m.Insecure() && secure:
			return nil, fmt.Errorf("etcd %s: https:// endpoints need --certs-dir (etcd.%s.crt is the client certificate), not --insecure", ep, identity)
		case !m.Insecure() && !secure:
			return nil, fmt.Errorf("etcd %s: want https://: with --certs-dir every etcd client authenticates with its certificate (pass --insecure for a plaintext etcd)", ep)
		}
	}
	if m.Insecure() {
		return nil, nil
	}
	cfg, err := m.EtcdClientConfig(identity)
	if err != nil {
		return nil, fmt.Errorf("certs-dir: etcd client certificate: %w", err)
	}
	return cfg, nil
}

// etcdEndpoints is the --etcd flag's value, or its default: the local member at
// https://127.0.0.1:2379 (http:// with --insecure), as `quotad etcd` serves it by default.
func etcdEndpoints(v *viper.Viper, m *trust.Material) []string {
	if eps := v.GetStringSlice("etcd"); len(eps) > 0 {
		return eps
	}
	return []string{orDefaultURL("", "127.0.0.1:2379", m)}
}
