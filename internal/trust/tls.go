package trust

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Material is a process's certificates directory, checked at Load: the CA it trusts and the
// pairs it presents. A nil *Material means insecure: plaintext, no client certificates and
// no authorization, for people who ask for it with --insecure.
type Material struct {
	dir  string
	pool *x509.CertPool

	mu   sync.Mutex
	held map[string]time.Time // file → NotAfter of each certificate loaded (Held)
}

// ErrExpired is a certificate past its NotAfter, refused when it is loaded: every peer would
// refuse it at the handshake.
var ErrExpired = errors.New("certificate expired")

// Load opens a certificates directory; it must hold ca.crt, not expired. Pairs are read when
// a server or client config is built, so a process needs only the files of what it does.
func Load(dir string) (*Material, error) {
	if dir == "" {
		return nil, fmt.Errorf("certs-dir: must be set (or run with --insecure)")
	}
	pool, ca, err := loadCA(dir)
	if err != nil {
		return nil, err
	}
	if err := notExpired(filepath.Join(dir, CACert), ca, "every certificate it signed is refused too: make a new CA and certificates (quotactl cert)"); err != nil {
		return nil, err
	}
	m := &Material{dir: dir, pool: pool, held: map[string]time.Time{}}
	m.hold(CACert, ca)
	return m, nil
}

// notExpired is ErrExpired, naming path and what to do, for a certificate past its NotAfter.
func notExpired(path string, c *x509.Certificate, todo string) error {
	now := time.Now()
	if !now.After(c.NotAfter) {
		return nil
	}
	ago := "less than a day ago"
	if days := -daysLeft(c.NotAfter, now) - 1; days > 0 {
		ago = fmt.Sprintf("%d days ago", days)
	}
	return fmt.Errorf("%s: %w at %s (%s): %s", path, ErrExpired, c.NotAfter.UTC().Format(time.RFC3339), ago, todo)
}

// hold records c as a certificate the process holds, under file.
func (m *Material) hold(file string, c *x509.Certificate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[file] = c.NotAfter
}

// HeldCert is a certificate a process loaded: its file (in the certificates directory) and
// when it expires.
type HeldCert struct {
	File     string
	NotAfter time.Time
}

// Held is every certificate the process has loaded from m so far (ca.crt at Load, each pair
// as a config is built), by file name; nil when insecure. A file loaded again counts as its
// latest load.
func (m *Material) Held() []HeldCert {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]HeldCert, 0, len(m.held))
	for f, t := range m.held {
		out = append(out, HeldCert{File: f, NotAfter: t})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out
}

// Insecure reports whether m is the insecure mode (nil).
func (m *Material) Insecure() bool { return m == nil }

// Dir is the certificates directory ("" when insecure).
func (m *Material) Dir() string {
	if m == nil {
		return ""
	}
	return m.dir
}

func (m *Material) pair(certFile, keyFile, hint string) (tls.Certificate, error) {
	cert, key := filepath.Join(m.dir, certFile), filepath.Join(m.dir, keyFile)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		if os.IsNotExist(err) {
			return pair, fmt.Errorf("%s: missing (%s)", cert, hint)
		}
		return pair, fmt.Errorf("%s: %w", cert, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return pair, fmt.Errorf("%s: %w", cert, err)
		}
	}
	if err := notExpired(cert, leaf, hint+" --overwrite"); err != nil {
		return tls.Certificate{}, err
	}
	m.hold(certFile, leaf)
	return pair, nil
}

// ServerConfig is the TLS config of every quotad listener: node.crt, TLS 1.3, and client
// certificates checked against ca.crt when given. A connection without one is accepted so
// that health checks stay open; every other call then fails Unauthenticated (Authorize).
func (m *Material) ServerConfig() (*tls.Config, error) {
	pair, err := m.pair(NodeCert, NodeKey, "create it with quotactl cert create-node --host HOST --certs-dir "+m.dir)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: m.pool, ClientAuth: tls.VerifyClientCertIfGiven,
		MinVersion: tls.VersionTLS13}, nil
}

// ClientConfig is a client's TLS config presenting role's certificate (client.<role>.crt)
// and trusting only ca.crt.
func (m *Material) ClientConfig(role Role) (*tls.Config, error) {
	pair, err := m.pair(ClientCert(role, ""), ClientKey(role, ""),
		fmt.Sprintf("create it with quotactl cert create-client --role %s --certs-dir %s", role, m.dir))
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: m.pool, MinVersion: tls.VersionTLS13}, nil
}

// NodeClientConfig is the TLS config of a server calling a peer that checks client
// certificates but knows no roles (etcd): node.crt as the client certificate, ca.crt as
// the only roots.
func (m *Material) NodeClientConfig() (*tls.Config, error) {
	pair, err := m.pair(NodeCert, NodeKey, "create it with quotactl cert create-node --host HOST --certs-dir "+m.dir)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: m.pool, MinVersion: tls.VersionTLS12}, nil
}

// ServerCreds are the gRPC transport credentials of a server: TLS, or plaintext when m is nil.
func (m *Material) ServerCreds() (credentials.TransportCredentials, error) {
	if m == nil {
		return insecure.NewCredentials(), nil
	}
	cfg, err := m.ServerConfig()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// ClientCreds are the gRPC transport credentials of a client acting as role: TLS with
// role's certificate, or plaintext when m is nil.
func (m *Material) ClientCreds(role Role) (credentials.TransportCredentials, error) {
	if m == nil {
		return insecure.NewCredentials(), nil
	}
	cfg, err := m.ClientConfig(role)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}
