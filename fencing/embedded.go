package fencing

import (
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Embedded is an in-process, single-member etcd for `quotad dev` and tests. It is a real
// etcd server (raft, WAL, leases, authentication), only not a separate process.
type Embedded struct {
	e *embed.Etcd
	// ClientURL and PeerURL are where the member serves clients and its (absent) peers.
	ClientURL, PeerURL string
}

// EmbeddedConfig configures an embedded member.
type EmbeddedConfig struct {
	// Dir stores the member's data.
	Dir string
	// ClientURL and PeerURL are http://host:port, or https:// with TLS.
	ClientURL, PeerURL string
	// TLS, when set, serves clients and the peer port over TLS and requires a client
	// certificate signed by its CA on both; the certificate's CN is then the etcd user once
	// authentication is on (EnsureAuth). Nil serves plaintext: tests and --insecure only.
	TLS *TLSFiles
	// Gateway serves etcd's JSON gateway (/v3/... over HTTP) beside gRPC. Off by default: the
	// gateway cannot authenticate by certificate, and a browser page may post to it.
	Gateway bool
}

// StartEmbedded starts a plaintext member without the JSON gateway, storing its data in
// dir, serving clients on clientURL and peers on peerURL (both http://127.0.0.1:port).
// Tests use it; quotad dev uses StartEmbeddedConfig with TLS.
func StartEmbedded(dir, clientURL, peerURL string) (*Embedded, error) {
	return StartEmbeddedConfig(EmbeddedConfig{Dir: dir, ClientURL: clientURL, PeerURL: peerURL})
}

// StartEmbeddedConfig starts a member as cfg says and waits until it serves.
func StartEmbeddedConfig(cfg EmbeddedConfig) (*Embedded, error) {
	cu, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd client url: %w", err)
	}
	pu, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd peer url: %w", err)
	}
	if cfg.TLS != nil {
		if err := cfg.TLS.validate(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	ec := embed.NewConfig()
	ec.Name = "quota-dev"
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*cu}
	ec.AdvertiseClientUrls = []url.URL{*cu}
	ec.ListenPeerUrls = []url.URL{*pu}
	ec.AdvertisePeerUrls = []url.URL{*pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.EnableGRPCGateway = cfg.Gateway
	if cfg.TLS != nil {
		ec.ClientTLSInfo = cfg.TLS.info()
		ec.PeerTLSInfo = cfg.TLS.peerInfo()
	}
	ec.LogLevel = "panic" // its shutdown logs errors that are not ours to act on
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready after 30s")
	}
	return &Embedded{e: e, ClientURL: cfg.ClientURL, PeerURL: cfg.PeerURL}, nil
}

// Close stops the member. Idempotent.
func (m *Embedded) Close() {
	if m != nil && m.e != nil {
		m.e.Close()
		m.e = nil
	}
}
