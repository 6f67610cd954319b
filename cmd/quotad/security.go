package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"

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

// insecureBanner is what a server prints, to stderr and its log, when it runs without TLS.
const insecureBanner = `
*** WARNING: running --insecure: plaintext, no client certificates, no roles. ***
*** Anyone who can reach these ports can create, move or destroy stock.        ***
`

// security loads the certificates a server command names, or returns nil for --insecure
// after saying so loudly.
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
