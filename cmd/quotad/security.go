package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
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

// etcdTLS is a server's TLS config for etcd at endpoints: nil when they are http://,
// node.crt as the client certificate and ca.crt as the roots when they are https://.
func etcdTLS(endpoints []string, m *trust.Material) (*tls.Config, error) {
	secure := 0
	for _, ep := range endpoints {
		if strings.HasPrefix(ep, "https://") {
			secure++
		}
	}
	switch {
	case secure == 0:
		return nil, nil
	case secure < len(endpoints):
		return nil, fmt.Errorf("etcd %s: endpoints mix https:// and plaintext", strings.Join(endpoints, ","))
	case m.Insecure():
		return nil, fmt.Errorf("etcd %s: https:// endpoints need --certs-dir (node.crt is the client certificate), not --insecure", strings.Join(endpoints, ","))
	}
	cfg, err := m.NodeClientConfig()
	if err != nil {
		return nil, fmt.Errorf("certs-dir: etcd client certificate: %w", err)
	}
	return cfg, nil
}
