// Package trust is the system's trust boundary: the certificates every process presents and
// checks (mutual TLS), the roles a client certificate names, and the one table of which role
// may call which RPC. A certificates directory holds, by fixed names:
//
//	ca.crt, ca.key                 the cluster's certificate authority (ca.key only where certs are made)
//	node.crt, node.key             a server's certificate, for every quotad listener
//	client.<role>.crt, .key        a client certificate naming a role (coordinator, storefront, operator, auditor)
//
// The role is the certificate subject's organizational unit (OU); the common name (CN) is the
// client's name, for logs. Keys are ECDSA P-256, written 0600.
package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Role is what a client certificate allows its holder to call (the table in roles.go).
type Role string

// The roles. A certificate naming any other OU has no role and may call only the open
// health service.
const (
	// Coordinator is the coordinator process calling the regions' ParticipantService.
	Coordinator Role = "coordinator"
	// Storefront is a shop's backend calling its nearest region.
	Storefront Role = "storefront"
	// Operator creates sales and moves stock; it may also read everything.
	Operator Role = "operator"
	// Auditor reads: the audit, sales, transfers, stock.
	Auditor Role = "auditor"
)

// Roles is every role, in the order help texts list them.
var Roles = []Role{Coordinator, Storefront, Operator, Auditor}

// ParseRole checks a role name.
func ParseRole(s string) (Role, error) {
	if r := Role(s); slices.Contains(Roles, r) {
		return r, nil
	}
	return "", fmt.Errorf("role %q: must be one of coordinator, storefront, operator, auditor", s)
}

// NodeCN is the common name of the servers' certificate (node.crt): the only one an etcd
// member's peer port accepts.
const NodeCN = "node"

// File names inside a certificates directory.
const (
	CACert   = "ca.crt"
	CAKey    = "ca.key"
	NodeCert = "node.crt"
	NodeKey  = "node.key"
)

// ClientCert and ClientKey name a role's client certificate files; a name other than the
// role's own is part of the file name (client.operator.alice.crt).
func ClientCert(role Role, name string) string { return clientBase(role, name) + ".crt" }

// ClientKey is the key file that goes with ClientCert.
func ClientKey(role Role, name string) string { return clientBase(role, name) + ".key" }

func clientBase(role Role, name string) string {
	if name == "" || name == string(role) {
		return "client." + string(role)
	}
	return "client." + string(role) + "." + name
}

// Lifetimes of what CreateCA, CreateNode and CreateClient make.
const (
	CALifetime   = 10 * 365 * 24 * time.Hour
	CertLifetime = 5 * 365 * 24 * time.Hour
)

// ExpiresSoon is how close to its NotAfter a certificate is flagged (List's "expires soon",
// a warning when a server starts) and EnsureDev makes a certificate of its own again.
const ExpiresSoon = 30 * 24 * time.Hour

// Option changes a certificate CreateCA, CreateNode or CreateClient makes.
type Option func(*x509.Certificate)

// ValidFor makes the certificate valid until d from now instead of its kind's lifetime
// (CALifetime, CertLifetime); a negative d makes one already expired (valid for the hour
// before). For tests of expiry.
func ValidFor(d time.Duration) Option {
	return func(c *x509.Certificate) {
		c.NotAfter = time.Now().Add(d)
		if from := c.NotAfter.Add(-time.Hour); from.Before(c.NotBefore) {
			c.NotBefore = from
		}
	}
}

// ErrExists is returned when a file to be created is already there and overwrite is off.
var ErrExists = errors.New("already exists")

// CreateCA writes a new certificate authority (ca.crt, ca.key) into dir. Replacing the CA
// revokes every certificate it signed: they must all be made again.
func CreateCA(dir string, overwrite bool, opts ...Option) error {
	if err := mayWrite(dir, overwrite, CACert, CAKey); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("ca key: %w", err)
	}
	tmpl, err := template(pkix.Name{CommonName: "quota CA", Organization: []string{"quota"}}, CALifetime)
	if err != nil {
		return err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	for _, o := range opts {
		o(tmpl)
	}
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("ca certificate: %w", err)
	}
	return writePair(dir, CACert, CAKey, der, key)
}

// CreateNode writes node.crt and node.key for the servers, valid for hosts (names or IP
// addresses); the certificate also serves as a client certificate of no role.
func CreateNode(dir string, hosts []string, overwrite bool, opts ...Option) error {
	if len(hosts) == 0 {
		return errors.New("host: name at least one host name or IP address the servers answer on")
	}
	tmpl, err := template(pkix.Name{CommonName: NodeCN, OrganizationalUnit: []string{"node"}, Organization: []string{"quota"}}, CertLifetime)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	return sign(dir, tmpl, NodeCert, NodeKey, overwrite, opts...)
}

// CreateClient writes a client certificate naming role, with name as its common name
// (the role when empty).
func CreateClient(dir string, role Role, name string, overwrite bool, opts ...Option) error {
	if _, err := ParseRole(string(role)); err != nil {
		return err
	}
	if name == "" {
		name = string(role)
	}
	if strings.ContainsAny(name, "/\\ \t\n") || len(name) > 64 {
		return fmt.Errorf("name %q: at most 64 characters, no spaces or slashes", name)
	}
	if name == EtcdRoot {
		return fmt.Errorf("name %q: reserved for etcd's administrator (etcd.go): a client certificate named root would be root in etcd", name)
	}
	tmpl, err := template(pkix.Name{CommonName: name, OrganizationalUnit: []string{string(role)}, Organization: []string{"quota"}}, CertLifetime)
	if err != nil {
		return err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return sign(dir, tmpl, ClientCert(role, name), ClientKey(role, name), overwrite, opts...)
}

// DevHosts are the hosts `quotad dev` certificates are valid for.
var DevHosts = []string{"localhost", "127.0.0.1", "::1"}

// EnsureDev creates, in dir, whatever of a development cluster's certificates is missing or
// no longer serves: the CA, the node certificate for hosts, and one client certificate per
// role. It returns the files it wrote. A missing CA with certificates present is an error:
// they were signed by a CA that is gone, and replacing it silently would lock out every
// existing client.
//
// A node or client certificate that has expired, expires within ExpiresSoon, is not signed by
// ca.crt, or (node.crt) does not name every host is made again, signed by the same CA. The CA
// is made again only once it has expired, when every certificate it signed is refused anyway:
// before that a new CA would cut off every client that holds a certificate of the old one
// (List and the servers warn within ExpiresSoon). Then node.crt and the role certificates are
// made again under the new CA; any other certificate of the old one must be made again by hand.
func EnsureDev(dir string, hosts []string) ([]string, error) {
	now := time.Now()
	made, err := ensureDevCA(dir, now)
	if err != nil {
		return nil, err
	}
	pool, _, err := loadCA(dir)
	if err != nil {
		return made, err
	}
	// A key without its certificate is of no use: it is replaced with the pair.
	if path := filepath.Join(dir, NodeCert); !serves(path, pool, now) || !coversHosts(path, hosts) {
		if err := CreateNode(dir, hosts, true); err != nil {
			return made, err
		}
		made = append(made, NodeCert, NodeKey)
	}
	for _, r := range Roles {
		if !serves(filepath.Join(dir, ClientCert(r, "")), pool, now) {
			if err := CreateClient(dir, r, "", true); err != nil {
				return made, err
			}
			made = append(made, ClientCert(r, ""), ClientKey(r, ""))
		}
	}
	return made, nil
}

// ensureDevCA makes dir's CA when it is missing (and no node certificate is there) or has
// expired, and returns the files it wrote.
func ensureDevCA(dir string, now time.Time) ([]string, error) {
	path := filepath.Join(dir, CACert)
	if !exists(path) {
		if exists(filepath.Join(dir, NodeCert)) {
			return nil, fmt.Errorf("%s: missing, but %s is there: restore the CA or empty the directory", path, NodeCert)
		}
	} else if c, err := readCert(path); err != nil || !now.After(c.NotAfter) {
		return nil, err // a CA that still works is kept, even within ExpiresSoon
	}
	if err := CreateCA(dir, true); err != nil {
		return nil, err
	}
	return []string{CACert, CAKey}, nil
}

// serves reports whether the certificate at path is one to keep: readable, signed by pool's
// CA and more than ExpiresSoon from its NotAfter at now.
func serves(path string, pool *x509.CertPool, now time.Time) bool {
	c, err := readCert(path)
	if err != nil || c.NotAfter.Sub(now) <= ExpiresSoon {
		return false
	}
	_, err = c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}

// coversHosts reports whether the certificate at path is valid for every one of hosts.
func coversHosts(path string, hosts []string) bool {
	c, err := readCert(path)
	if err != nil {
		return false
	}
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// The problems List names.
const (
	// ProblemExpired is a certificate past its NotAfter: refused.
	ProblemExpired = "expired"
	// ProblemNotSigned is a certificate ca.crt did not sign: refused.
	ProblemNotSigned = "not signed by " + CACert
	// ProblemExpiresSoon is a certificate within ExpiresSoon of its NotAfter: still accepted.
	ProblemExpiresSoon = "expires soon"
)

// CertInfo describes one certificate file of a directory.
type CertInfo struct {
	File     string    `json:"file"`
	Kind     string    `json:"kind"` // ca, node or client
	Role     Role      `json:"role,omitempty"`
	Name     string    `json:"name"`
	Hosts    []string  `json:"hosts,omitempty"`
	NotAfter time.Time `json:"not_after"`
	// DaysLeft is the whole days from List's now to NotAfter, rounded down: negative once
	// expired.
	DaysLeft int `json:"days_left"`
	// Problem is why the certificate would be refused (ProblemExpired, ProblemNotSigned),
	// ProblemExpiresSoon for one accepted for less than ExpiresSoon more, or "".
	Problem string `json:"problem,omitempty"`
}

// Refused reports whether a server or client would refuse the certificate now.
func (c CertInfo) Refused() bool { return c.Problem != "" && c.Problem != ProblemExpiresSoon }

// List describes every certificate in dir, checking each against ca.crt.
func List(dir string, now time.Time) ([]CertInfo, error) {
	pool, _, err := loadCA(dir)
	if err != nil {
		return nil, err
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []CertInfo
	for _, path := range names {
		c, err := readCert(path)
		if err != nil {
			return nil, err
		}
		out = append(out, describe(filepath.Base(path), c, pool, now))
	}
	return out, nil
}

func describe(file string, c *x509.Certificate, pool *x509.CertPool, now time.Time) CertInfo {
	info := CertInfo{File: file, Name: c.Subject.CommonName, NotAfter: c.NotAfter, Hosts: c.DNSNames,
		DaysLeft: daysLeft(c.NotAfter, now)}
	for _, ip := range c.IPAddresses {
		info.Hosts = append(info.Hosts, ip.String())
	}
	switch {
	case c.IsCA:
		info.Kind = "ca"
	case file == NodeCert:
		info.Kind = "node"
	case strings.HasPrefix(file, "etcd."):
		info.Kind = "etcd"
	default:
		info.Kind, info.Role = "client", RoleOf(c)
	}
	if now.After(c.NotAfter) {
		info.Problem = ProblemExpired
	} else if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		info.Problem = ProblemNotSigned
	} else if c.NotAfter.Sub(now) <= ExpiresSoon {
		info.Problem = ProblemExpiresSoon
	}
	return info
}

// daysLeft is the whole days from now to notAfter, rounded down (negative once past).
func daysLeft(notAfter, now time.Time) int {
	d := notAfter.Sub(now)
	days := int(d / (24 * time.Hour))
	if d < 0 && d%(24*time.Hour) != 0 {
		days--
	}
	return days
}

// RoleOf is the role a verified client certificate names, or "" for none.
func RoleOf(c *x509.Certificate) Role {
	for _, ou := range c.Subject.OrganizationalUnit {
		if r, err := ParseRole(ou); err == nil {
			return r
		}
	}
	return ""
}

func template(subject pkix.Name, life time.Duration) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{SerialNumber: serial, Subject: subject, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(life),
		KeyUsage: x509.KeyUsageDigitalSignature}, nil
}

// sign issues tmpl with dir's CA and writes it with a fresh key.
func sign(dir string, tmpl *x509.Certificate, certFile, keyFile string, overwrite bool, opts ...Option) error {
	if err := mayWrite(dir, overwrite, certFile, keyFile); err != nil {
		return err
	}
	for _, o := range opts {
		o(tmpl)
	}
	caCert, caKey, err := loadCAKey(dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("%s: key: %w", certFile, err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("%s: %w", certFile, err)
	}
	return writePair(dir, certFile, keyFile, der, key)
}

func mayWrite(dir string, overwrite bool, files ...string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("certs-dir: %w", err)
	}
	for _, f := range files {
		if p := filepath.Join(dir, f); !overwrite && exists(p) {
			return fmt.Errorf("%s: %w (pass --overwrite to replace it)", p, ErrExists)
		}
	}
	return nil
}

func writePair(dir, certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("%s: %w", keyFile, err)
	}
	if err := writeFile(filepath.Join(dir, keyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, certFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeFile writes through a temporary file and a rename, so a reader never sees half a file.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func readCert(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: not a PEM certificate", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func loadCA(dir string) (*x509.CertPool, *x509.Certificate, error) {
	c, err := readCert(filepath.Join(dir, CACert))
	if err != nil {
		return nil, nil, fmt.Errorf("certificate authority: %w (create one with quotactl cert create-ca --certs-dir %s)", err, dir)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool, c, nil
}

func loadCAKey(dir string) (*x509.Certificate, any, error) {
	_, c, err := loadCA(dir)
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(dir, CAKey)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("ca key: %w (certificates are signed where ca.key is)", err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, nil, fmt.Errorf("%s: not a PEM key", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, key, nil
}
