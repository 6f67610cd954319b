package fencing_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/trust"
)

// TestTLSMemberWantsAClientCertificate: a member started with TLS serves a client that
// presents the node certificate and refuses one that presents none, or dials plaintext.
func TestTLSMemberWantsAClientCertificate(t *testing.T) {
	certs := t.TempDir()
	if err := trust.CreateCA(certs, false); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateNode(certs, []string{"127.0.0.1", "localhost"}, false); err != nil {
		t.Fatal(err)
	}
	files := &fencing.TLSFiles{CertFile: filepath.Join(certs, trust.NodeCert), KeyFile: filepath.Join(certs, trust.NodeKey),
		TrustedCAFile: filepath.Join(certs, trust.CACert)}
	client, peer := "https://"+testnet.Addr(t), "https://"+testnet.Addr(t)
	cfg := fencing.MemberConfig{Name: "e1", Dir: t.TempDir(), ClientURL: client, PeerURL: peer,
		InitialCluster: "e1=" + peer, LogLevel: "error", TLS: files}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := fencing.StartMember(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	mat, err := trust.Load(certs)
	if err != nil {
		t.Fatal(err)
	}
	node, err := mat.NodeClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := fencing.DialTLS([]string{client}, 5*time.Second, node)
	if err != nil {
		t.Fatalf("dial with the node certificate: %v", err)
	}
	c.Close()

	pem, err := os.ReadFile(filepath.Join(certs, trust.CACert))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	if c, err := fencing.DialTLS([]string{client}, 2*time.Second, &tls.Config{RootCAs: roots}); err == nil {
		c.Close()
		t.Fatal("a client without a certificate was served")
	}
	if c, err := fencing.Dial([]string{client}, time.Second); err == nil {
		c.Close()
		t.Fatal("a plaintext client was served")
	}
	if c, err := fencing.Dial([]string{strings.Replace(client, "https", "http", 1)}, 2*time.Second); err == nil {
		c.Close()
		t.Fatal("a plaintext client was served on http://")
	}
}

// TestTLSMemberConfigWantsHTTPS: with TLS every URL must be https://, without it http://.
func TestTLSMemberConfigWantsHTTPS(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	files := &fencing.TLSFiles{CertFile: f, KeyFile: f, TrustedCAFile: f}
	for _, c := range []fencing.MemberConfig{
		{Name: "e1", Dir: dir, ClientURL: "http://127.0.0.1:1", PeerURL: "https://127.0.0.1:2", InitialCluster: "e1=https://127.0.0.1:2", TLS: files},
		{Name: "e1", Dir: dir, ClientURL: "https://127.0.0.1:1", PeerURL: "https://127.0.0.1:2", InitialCluster: "e1=https://127.0.0.1:2,e2=http://127.0.0.1:3", TLS: files},
		{Name: "e1", Dir: dir, ClientURL: "https://127.0.0.1:1", PeerURL: "http://127.0.0.1:2", InitialCluster: "e1=http://127.0.0.1:2"},
		{Name: "e1", Dir: dir, ClientURL: "https://127.0.0.1:1", PeerURL: "https://127.0.0.1:2", InitialCluster: "e1=https://127.0.0.1:2",
			TLS: &fencing.TLSFiles{CertFile: f, KeyFile: f}},
		{Name: "e1", Dir: dir, ClientURL: "https://127.0.0.1:1", PeerURL: "https://127.0.0.1:2", ListenPeerURL: "http://127.0.0.1:4",
			InitialCluster: "e1=https://127.0.0.1:2", TLS: files},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", c)
		}
	}
	ok := fencing.MemberConfig{Name: "e1", Dir: dir, ClientURL: "https://127.0.0.1:1", PeerURL: "https://127.0.0.1:2",
		InitialCluster: "e1=https://127.0.0.1:2", TLS: files}
	if err := ok.Validate(); err != nil {
		t.Errorf("%+v: %v", ok, err)
	}
	ok.ListenPeerURL = "https://127.0.0.1:4" // behind a proxy serving PeerURL
	if err := ok.Validate(); err != nil {
		t.Errorf("%+v: %v", ok, err)
	}
}
