package fencing

import (
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Embedded is an in-process, single-member etcd for `quotad dev` and tests. It is a real
// etcd server (raft, WAL, leases), only not a separate process.
type Embedded struct {
	e         *embed.Etcd
	ClientURL string
}

// StartEmbedded starts a member storing its data in dir, serving clients on clientURL and
// peers on peerURL (both http://127.0.0.1:port).
func StartEmbedded(dir, clientURL, peerURL string) (*Embedded, error) {
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd client url: %w", err)
	}
	pu, err := url.Parse(peerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd peer url: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "quota-dev"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "panic" // its shutdown logs errors that are not ours to act on
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready after 30s")
	}
	return &Embedded{e: e, ClientURL: clientURL}, nil
}

// Close stops the member. Idempotent.
func (m *Embedded) Close() {
	if m != nil && m.e != nil {
		m.e.Close()
		m.e = nil
	}
}
