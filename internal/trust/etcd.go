package trust

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// etcd authenticates a client by its certificate's common name (CN): with client-certificate
// auth and authentication on, the CN is the etcd user and needs no password. Each process
// that talks to etcd has a certificate of its own, named etcd.<identity>.crt, whose CN is the
// etcd user its roles are granted to (fencing.EnsureAuth):
//
//	etcd.root.crt            CN root              etcd's administrator: sets up users and roles; operators' etcdctl
//	etcd.coordinator.crt     CN quota/coordinator  every coordinator process
//	etcd.region-<name>.crt   CN quota/region/<name> every process of region <name> (leader and standbys)
//
// Every other certificate of the CA (node.crt, client.<role>.crt) names no etcd user and so
// may do nothing in etcd. The users other than root carry a '/', which no client certificate's
// name may (CreateClient), and no client certificate may be named root: a storefront's
// certificate can never be an etcd user.

// EtcdRoot is etcd's administrator, the one user that may change users, roles and
// authentication (etcd requires the name).
const EtcdRoot = "root"

// EtcdCoordinator is the etcd identity of the coordinator processes.
const EtcdCoordinator = "coordinator"

// EtcdRegion is the etcd identity of region name's processes.
func EtcdRegion(name string) string { return "region-" + name }

// EtcdUser is the etcd user (the certificate's CN) of an identity: root, quota/coordinator,
// quota/region/<name>.
func EtcdUser(identity string) string {
	if identity == EtcdRoot {
		return EtcdRoot
	}
	if region, ok := strings.CutPrefix(identity, "region-"); ok {
		return "quota/region/" + region
	}
	return "quota/" + identity
}

// EtcdCert and EtcdKey name an etcd identity's certificate files.
func EtcdCert(identity string) string { return "etcd." + identity + ".crt" }

// EtcdKey is the key file that goes with EtcdCert.
func EtcdKey(identity string) string { return "etcd." + identity + ".key" }

// CheckEtcdIdentity checks an identity: root, coordinator or region-<name> with a valid
// region name.
func CheckEtcdIdentity(identity string) error {
	if identity == EtcdRoot || identity == EtcdCoordinator {
		return nil
	}
	if region, ok := strings.CutPrefix(identity, "region-"); ok {
		if !regionName.MatchString(region) {
			return fmt.Errorf("identity %q: the region name must be 1..32 lowercase letters, digits or '-', starting with a letter", identity)
		}
		return nil
	}
	return fmt.Errorf("identity %q: want root, coordinator or region-<name>", identity)
}

// regionName is a region's name, as transfer.CheckRegion has it.
var regionName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// CreateEtcd writes the certificate of an etcd identity (etcd.<identity>.crt and .key),
// signed by dir's CA, usable only as a client certificate.
func CreateEtcd(dir, identity string, overwrite bool) error {
	if err := CheckEtcdIdentity(identity); err != nil {
		return err
	}
	tmpl, err := template(pkix.Name{CommonName: EtcdUser(identity), OrganizationalUnit: []string{"etcd"}, Organization: []string{"quota"}}, CertLifetime)
	if err != nil {
		return err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return sign(dir, tmpl, EtcdCert(identity), EtcdKey(identity), overwrite)
}

// EnsureDevEtcd creates, in dir, whatever etcd identity certificate of a development cluster
// is missing, expired, within ExpiresSoon of its end or not signed by ca.crt (as EnsureDev
// does for the others): root, the coordinator and one per region. It returns the files it
// wrote.
func EnsureDevEtcd(dir string, regions []string) ([]string, error) {
	pool, _, err := loadCA(dir)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ids := append([]string{EtcdRoot, EtcdCoordinator}, mapRegions(regions)...)
	var made []string
	for _, id := range ids {
		if serves(filepath.Join(dir, EtcdCert(id)), pool, now) {
			continue
		}
		if err := CreateEtcd(dir, id, true); err != nil {
			return made, err
		}
		made = append(made, EtcdCert(id), EtcdKey(id))
	}
	return made, nil
}

func mapRegions(regions []string) []string {
	out := make([]string, len(regions))
	for i, r := range regions {
		out[i] = EtcdRegion(r)
	}
	return out
}

// EtcdClientConfig is the TLS config of a client of etcd as identity: its etcd certificate,
// and ca.crt as the roots.
func (m *Material) EtcdClientConfig(identity string) (*tls.Config, error) {
	if err := CheckEtcdIdentity(identity); err != nil {
		return nil, err
	}
	pair, err := m.pair(EtcdCert(identity), EtcdKey(identity),
		fmt.Sprintf("create it with quotactl cert create-etcd --identity %s --certs-dir %s", identity, m.dir))
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: m.pool, MinVersion: tls.VersionTLS12}, nil
}
