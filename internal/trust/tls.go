package trust

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Material is a process's certificates directory, checked at Load: the CA it trusts and the
// pairs it presents. A nil *Material means insecure: plaintext, no client certificates and
// no authorization, for people who ask for it with --insecure.
type Material struct {
	dir  string
	pool *x509.CertPool
}

// Load opens a certificates directory; it must hold ca.crt. Pairs are read when a server or
// client config is built, so a process needs only the files of what it does.
func Load(dir string) (*Material, error) {
	if dir == "" {
		return nil, fmt.Errorf("certs-dir: must be set (or run with --insecure)")
	}
	pool, _, err := loadCA(dir)
	if err != nil {
		return nil, err
	}
	return &Material{dir: dir, pool: pool}, nil
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
