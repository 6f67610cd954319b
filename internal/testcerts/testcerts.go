// Package testcerts gives tests a cluster's certificates and clients that present them, so
// integration tests run in the secure default: mutual TLS and roles.
package testcerts

import (
	"fmt"
	"os"
	"testing"

	"github.com/quotaworks/quota/internal/trust"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Regions are the regions whose etcd certificates New and Main make (trust.EnsureDevEtcd),
// so that tests sharing one directory never make them at once: a dev cluster of tests names
// only these.
var Regions = []string{"us", "eu", "ap"}

// New creates a development certificates directory (CA, node and one client certificate per
// role) in a fresh temporary directory and loads it.
func New(t testing.TB) *trust.Material {
	t.Helper()
	dir := t.TempDir()
	if _, err := trust.EnsureDev(dir, trust.DevHosts); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.EnsureDevEtcd(dir, Regions); err != nil {
		t.Fatal(err)
	}
	m, err := trust.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Dial connects to addr presenting role's certificate from m (plaintext when m is nil); the
// connection closes when the test ends.
func Dial(t testing.TB, m *trust.Material, addr string, role trust.Role) *grpc.ClientConn {
	t.Helper()
	creds, err := m.ClientCreds(role)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// DialAnonymous connects to addr over TLS trusting m's CA but presenting no certificate.
func DialAnonymous(t testing.TB, m *trust.Material, addr string) *grpc.ClientConn {
	t.Helper()
	cfg, err := m.ClientConfig(trust.Auditor)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates = nil
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Main runs a test binary's tests (from TestMain) with one certificates directory for the
// whole package, made in a fresh temporary directory, set in *certs, and removed at the end;
// it exits with the tests' status.
func Main(m *testing.M, certs **trust.Material) {
	dir, err := os.MkdirTemp("", "quota-test-certs-")
	if err == nil {
		if _, err = trust.EnsureDev(dir, trust.DevHosts); err == nil {
			if _, err = trust.EnsureDevEtcd(dir, Regions); err == nil {
				*certs, err = trust.Load(dir)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "test certificates:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "remove test certificates:", err)
	}
	os.Exit(code)
}
