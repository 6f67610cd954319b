package fencing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/quotaworks/quota/internal/trust"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// TLSFiles names the PEM files of a member's TLS. The member serves clients and peers with
// CertFile/KeyFile and requires a client certificate signed by TrustedCAFile on both; it
// presents the same pair to its peers, so the certificate needs both the server and the
// client extended key usage (quotactl's node.crt has them).
type TLSFiles struct {
	CertFile      string
	KeyFile       string
	TrustedCAFile string
	// ClientCNs, when set, are the only common names the client port accepts, at the TLS
	// handshake: the etcd users (Users). Any other certificate of the CA (a storefront's) is
	// refused before it can grant a lease or read the members. Empty: any certificate of the CA.
	ClientCNs []string
}

// info is etcd's form of f for the client port, with client-certificate auth on.
func (f *TLSFiles) info() transport.TLSInfo {
	return transport.TLSInfo{CertFile: f.CertFile, KeyFile: f.KeyFile, TrustedCAFile: f.TrustedCAFile, ClientCertAuth: true,
		AllowedCNs: f.ClientCNs}
}

// peerInfo is etcd's form of f for the peer port: only a member's certificate (CN
// trust.NodeCN) may speak raft there. etcd checks no user on the peer port, so a client
// certificate accepted there could keep any lease alive or forge raft messages.
func (f *TLSFiles) peerInfo() transport.TLSInfo {
	return transport.TLSInfo{CertFile: f.CertFile, KeyFile: f.KeyFile, TrustedCAFile: f.TrustedCAFile, ClientCertAuth: true,
		AllowedCNs: []string{trust.NodeCN}}
}

// validate checks that every file is named and readable, naming the missing one.
func (f *TLSFiles) validate() error {
	for field, path := range map[string]string{"cert-file": f.CertFile, "key-file": f.KeyFile, "trusted-ca-file": f.TrustedCAFile} {
		if path == "" {
			return fmt.Errorf("tls %s: must be set", field)
		}
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("tls %s: %w", field, err)
		}
	}
	return nil
}

// MemberConfig configures one member of a static, multi-member etcd cluster (the local
// multi-process cluster of deploy/local runs three).
type MemberConfig struct {
	// Name is the member's name in InitialCluster (e1, e2, ...).
	Name string
	// Dir holds the member's data (WAL and snapshots, in Dir/member).
	Dir string
	// ClientURL and PeerURL are http://host:port (https:// with TLS); the member listens on
	// and advertises them.
	ClientURL string
	PeerURL   string
	// ListenPeerURL, when set, is where the member listens for its peers instead of PeerURL,
	// which it still advertises: a proxy in front of the member (deploy/local's --wan delay
	// links) serves PeerURL and forwards to it. Empty: the member listens on PeerURL.
	ListenPeerURL string
	// InitialCluster names every member's peer URL: "e1=http://127.0.0.1:7591,e2=...,e3=...".
	// It must contain Name=PeerURL.
	InitialCluster string
	// Token tells clusters apart when they bootstrap (default "quota-local").
	Token string
	// LogLevel is etcd's: debug, info, warn, error (default warn).
	LogLevel string
	// TLS, when set, secures client and peer traffic with client-certificate auth; every
	// URL (InitialCluster's too) must then be https://. Nil serves plaintext http://.
	TLS *TLSFiles
	// Gateway serves etcd's JSON gateway (/v3/... over HTTP) beside gRPC; off by default
	// (EmbeddedConfig.Gateway says why).
	Gateway bool
}

// Validate checks the configuration, naming the bad field.
func (c *MemberConfig) Validate() error {
	if c.Name == "" || strings.ContainsAny(c.Name, "=,") {
		return fmt.Errorf("name %q: must be set and contain neither '=' nor ','", c.Name)
	}
	if c.Dir == "" {
		return errors.New("data-dir: must be set")
	}
	scheme := "http"
	if c.TLS != nil {
		if err := c.TLS.validate(); err != nil {
			return err
		}
		scheme = "https"
	}
	urls := map[string]string{"client-url": c.ClientURL, "peer-url": c.PeerURL}
	if c.ListenPeerURL != "" {
		urls["listen-peer-url"] = c.ListenPeerURL
	}
	for field, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != scheme || u.Host == "" {
			return fmt.Errorf("%s %q: want %s://host:port%s", field, raw, scheme, tlsHint(c.TLS != nil))
		}
	}
	found := false
	for _, m := range strings.Split(c.InitialCluster, ",") {
		name, peer, ok := strings.Cut(strings.TrimSpace(m), "=")
		if !ok || name == "" || peer == "" {
			return fmt.Errorf("initial-cluster %q: want name=peer-url,name=peer-url,...", c.InitialCluster)
		}
		if !strings.HasPrefix(peer, scheme+"://") {
			return fmt.Errorf("initial-cluster member %s=%s: want a %s:// peer URL%s", name, peer, scheme, tlsHint(c.TLS != nil))
		}
		if name == c.Name {
			if peer != c.PeerURL {
				return fmt.Errorf("initial-cluster names %s=%s, but peer-url is %s", name, peer, c.PeerURL)
			}
			found = true
		}
	}
	if !found {
		return fmt.Errorf("initial-cluster %q: does not name this member (%s=%s)", c.InitialCluster, c.Name, c.PeerURL)
	}
	switch c.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return nil
}

func tlsHint(secure bool) string {
	if secure {
		return " (the member serves TLS)"
	}
	return " (the member serves plaintext: https needs TLS)"
}

// Member is a running member of a multi-member etcd cluster.
type Member struct {
	e    *embed.Etcd
	once sync.Once
	// ClientURL is where clients reach this member.
	ClientURL string
	// State is "new" when the member bootstrapped with this start, "existing" when it
	// restarted from the data already in its directory.
	State string
}

// HasMemberData reports whether dir already holds an etcd member's data.
func HasMemberData(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, "member"))
	return err == nil && st.IsDir()
}

// StartMember starts one member and waits until it serves: until the cluster has a quorum
// (a member alone never becomes ready), the member stops on its own (an error), or ctx ends.
// On an error the member is closed.
func StartMember(ctx context.Context, cfg MemberConfig) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cu, _ := url.Parse(cfg.ClientURL)
	pu, _ := url.Parse(cfg.PeerURL)
	lpu := pu
	if cfg.ListenPeerURL != "" {
		lpu, _ = url.Parse(cfg.ListenPeerURL)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*cu}
	ec.AdvertiseClientUrls = []url.URL{*cu}
	ec.ListenPeerUrls = []url.URL{*lpu}
	ec.AdvertisePeerUrls = []url.URL{*pu}
	ec.InitialCluster = cfg.InitialCluster
	ec.InitialClusterToken = cfg.Token
	if ec.InitialClusterToken == "" {
		ec.InitialClusterToken = "quota-local"
	}
	ec.EnableGRPCGateway = cfg.Gateway
	ec.ClusterState = embed.ClusterStateFlagNew
	if HasMemberData(cfg.Dir) {
		ec.ClusterState = embed.ClusterStateFlagExisting
	}
	if cfg.TLS != nil {
		ec.ClientTLSInfo = cfg.TLS.info()
		ec.PeerTLSInfo = cfg.TLS.peerInfo()
	}
	ec.LogLevel = cfg.LogLevel
	if ec.LogLevel == "" {
		ec.LogLevel = "warn"
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start etcd member %s: %w", cfg.Name, err)
	}
	m := &Member{e: e, ClientURL: cfg.ClientURL, State: ec.ClusterState}
	select {
	case <-e.Server.ReadyNotify():
		return m, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
	case <-e.Server.StopNotify():
		e.Close()
		return nil, fmt.Errorf("etcd member %s stopped before it was ready", cfg.Name)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("etcd member %s not ready (no quorum yet?): %w", cfg.Name, ctx.Err())
	}
}

// Done is closed when the member stops on its own (for instance after it was removed from
// the cluster) or after Close.
func (m *Member) Done() <-chan struct{} { return m.e.Server.StopNotify() }

// Err reports errors of the member's listeners; a member that reports one should be closed.
func (m *Member) Err() <-chan error { return m.e.Err() }

// Close stops the member. Idempotent.
func (m *Member) Close() { m.once.Do(m.e.Close) }
