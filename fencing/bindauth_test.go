package fencing_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/trust"
)

// authEtcd is an embedded member serving TLS with authentication on, as quotad dev runs it.
type authEtcd struct {
	url string
	mat *trust.Material
}

// startAuthEtcd starts a TLS member, makes the users and roles of regions (EnsureAuth, as
// root) and turns authentication on.
func startAuthEtcd(tb testing.TB, regions ...string) *authEtcd {
	tb.Helper()
	dir := tb.TempDir()
	if err := trust.CreateCA(dir, false); err != nil {
		tb.Fatal(err)
	}
	if err := trust.CreateNode(dir, []string{"127.0.0.1", "localhost"}, false); err != nil {
		tb.Fatal(err)
	}
	if _, err := trust.EnsureDevEtcd(dir, regions); err != nil {
		tb.Fatal(err)
	}
	files := &fencing.TLSFiles{CertFile: filepath.Join(dir, trust.NodeCert), KeyFile: filepath.Join(dir, trust.NodeKey),
		TrustedCAFile: filepath.Join(dir, trust.CACert)}
	e, err := fencing.StartEmbeddedConfig(fencing.EmbeddedConfig{Dir: tb.TempDir(), ClientURL: "https://" + testnet.Addr(tb),
		PeerURL: "https://" + testnet.Addr(tb), TLS: files})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	mat, err := trust.Load(dir)
	if err != nil {
		tb.Fatal(err)
	}
	a := &authEtcd{url: e.ClientURL, mat: mat}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fencing.EnsureAuth(ctx, a.dial(tb, trust.EtcdRoot), regions); err != nil {
		tb.Fatal(err)
	}
	return a
}

// dial connects as identity (trust.EtcdRoot, trust.EtcdRegion(name), ...), closed at the end.
func (a *authEtcd) dial(tb testing.TB, identity string) *fencing.Client {
	tb.Helper()
	cfg, err := a.mat.EtcdClientConfig(identity)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := fencing.DialTLS([]string{a.url}, 5*time.Second, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// TestBindLeasesHoldBoundedRecords: with authentication on, etcd checks a region's right to
// every key on a lease each time it puts another on it; a Binder puts at most
// MaxBindsPerLease records on one lease, so a sale's binds stay linear in its buyers. Every
// buyer is bound, and the records still carry leases of the retention.
func TestBindLeasesHoldBoundedRecords(t *testing.T) {
	ctx := context.Background()
	e := startAuthEtcd(t, "us")
	b := fencing.NewBinder(e.dial(t, trust.EtcdRegion("us")), time.Hour)
	defer b.Close()
	buyers := 2*fencing.MaxBindsPerLease + 1
	for i := range buyers {
		if got, err := b.Bind(ctx, "s1", fmt.Sprintf("u%d", i), "us"); err != nil || got != "us" {
			t.Fatalf("bind u%d = %q, %v; want us", i, got, err)
		}
	}
	// Binding a buyer again reads the record back and gives the same answer.
	if got, err := b.Bind(ctx, "s1", "u0", "us"); err != nil || got != "us" {
		t.Fatalf("bind u0 again = %q, %v; want us", got, err)
	}
	raw := rawAuthEtcd(t, e)
	resp, err := raw.Get(ctx, "/quota/bind/s1|", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	perLease := map[int64]int{}
	for _, kv := range resp.Kvs {
		perLease[kv.Lease]++
	}
	if len(resp.Kvs) != buyers {
		t.Fatalf("%d records; want %d", len(resp.Kvs), buyers)
	}
	if want := (buyers + fencing.MaxBindsPerLease - 1) / fencing.MaxBindsPerLease; len(perLease) != want {
		t.Errorf("records on %d leases (%v); want %d", len(perLease), perLease, want)
	}
	for l, n := range perLease {
		if l == 0 || n > fencing.MaxBindsPerLease {
			t.Errorf("lease %x holds %d records; want a lease holding at most %d", l, n, fencing.MaxBindsPerLease)
			continue
		}
		ttl, err := raw.TimeToLive(ctx, clientv3.LeaseID(l))
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL < int64(time.Hour/time.Second) {
			t.Errorf("lease %x TTL %ds; want at least the retention (3600s)", l, ttl.TTL)
		}
	}
}

// rawAuthEtcd is a plain etcd client as root, to look at records the way etcd sees them.
func rawAuthEtcd(t *testing.T, e *authEtcd) *clientv3.Client {
	t.Helper()
	cfg, err := e.mat.EtcdClientConfig(trust.EtcdRoot)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{e.url}, DialTimeout: 5 * time.Second, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}
