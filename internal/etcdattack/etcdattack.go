// Package etcdattack replays, with Debian's etcdctl (package etcd-client), the writes an
// attacker who reaches the cluster's etcd would try, as each identity an attacker may hold:
// no certificate at all, or any certificate the cluster's CA signed that is not an etcd user
// (a storefront's, an operator's, an auditor's, the coordinator's RPC certificate, the
// servers' node.crt). Tests against `quotad dev` and deploy/local use it; every attempt must
// be refused (docs/security.md, "The coordination store").
package etcdattack

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Identity is what an attacker presents to etcd: a certificate and key (none when Cert is "").
type Identity struct {
	Name      string
	Cert, Key string
}

// Identities are the attacker's identities in a certificates directory: none, and each
// client role's certificate and node.crt.
func Identities(certsDir string) []Identity {
	out := []Identity{{Name: "no certificate"}}
	for _, base := range []string{"client.storefront", "client.operator", "client.auditor", "client.coordinator", "node"} {
		out = append(out, Identity{Name: base + ".crt", Cert: filepath.Join(certsDir, base+".crt"), Key: filepath.Join(certsDir, base+".key")})
	}
	return out
}

// Attempt is one etcdctl command an attacker runs.
type Attempt struct {
	What string
	Args []string
}

// Attempts are the writes found to hurt a sale when etcd trusted anyone, and the read of every
// binding: a buyer bound to a second region (above the per-user limit), a victim bound to a
// region that does not exist, a false drained flag, a false leader address under a region's
// election prefix with the real one deleted, a lease-less election key, and a raised
// coordinator generation. leaderKey is the region's real election key.
func Attempts(sale, sku, buyer, victim, region, leaderKey string) []Attempt {
	bind := func(user string) string { return "/quota/bind/" + sale + "|" + user }
	return []Attempt{
		{"bind a buyer to a second region", []string{"put", bind(buyer), "eu"}},
		{"bind a victim to a region that does not exist", []string{"put", bind(victim), "mars"}},
		{"raise a drained flag", []string{"put", "/quota/flags/drained/" + sale + "|" + sku, "1"}},
		{"raise a sold-out flag", []string{"put", "/quota/flags/soldout/" + sale + "|" + sku, "1"}},
		{"publish a false leader address", []string{"put", "/quota/election/region/" + region + "/6b1d0000000000ff", "127.0.0.1:1"}},
		{"delete the region's real leader key", []string{"del", leaderKey}},
		{"a coordinator election key from the future", []string{"put", "/quota/election/coordinator/7fffffffffffffff", "127.0.0.1:1"}},
		{"read every binding", []string{"get", "--prefix", "/quota/bind/"}},
		{"grant a lease (each one is written to disk)", []string{"lease", "grant", "60"}},
		{"list the members (the peer addresses)", []string{"member", "list"}},
	}
}

// HandshakeRefused reports whether the server at url (https://host:port) refuses id's
// certificate at the TLS handshake: etcd's client port accepts only the etcd users'
// certificates, its peer port only node.crt. With TLS 1.3 the refusal arrives as an alert
// at the first read after the handshake.
func HandshakeRefused(url, caFile string, id Identity) (bool, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return false, err
	}
	cfg.RootCAs = x509.NewCertPool()
	if !cfg.RootCAs.AppendCertsFromPEM(pem) {
		return false, fmt.Errorf("%s: no certificate", caFile)
	}
	if id.Cert != "" {
		pair, err := tls.LoadX509KeyPair(id.Cert, id.Key)
		if err != nil {
			return false, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", strings.TrimPrefix(url, "https://"), cfg)
	if err != nil {
		return strings.Contains(err.Error(), "certificate"), nil
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return false, err
	}
	_, err = conn.Read(make([]byte, 1))
	return err != nil && strings.Contains(err.Error(), "certificate"), nil
}

// Result is one attempt as one identity.
type Result struct {
	Identity, What, Output string
	// Refused is true when etcdctl failed. Denied is true when etcd said permission denied
	// (the request reached etcd and its authorization refused it); Handshake when the server
	// refused the identity's certificate at the TLS handshake, so no request of it can reach
	// etcd at all.
	Refused, Denied, Handshake bool
}

// Run runs etcdctl with args against endpoint, trusting caFile and presenting id.
func Run(ctx context.Context, endpoint, caFile string, id Identity, args ...string) (string, error) {
	base := []string{"--endpoints", endpoint, "--cacert", caFile, "--dial-timeout", "3s", "--command-timeout", "5s"}
	if id.Cert != "" {
		base = append(base, "--cert", id.Cert, "--key", id.Key)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, "etcdctl", append(base, args...)...)
	cmd.Env = append(cmd.Environ(), "ETCDCTL_API=3")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// Replay runs every attempt as every identity. An identity whose certificate the server
// refuses at the TLS handshake (HandshakeRefused) sends no request anywhere: etcdctl runs its
// first attempt only, to show the refusal with the real client, and every attempt is counted
// refused at the handshake.
func Replay(ctx context.Context, endpoint, caFile string, ids []Identity, attempts []Attempt) ([]Result, error) {
	if _, err := exec.LookPath("etcdctl"); err != nil {
		return nil, fmt.Errorf("etcdctl: %w (install Debian's etcd-client: make etcdctl)", err)
	}
	var out []Result
	for _, id := range ids {
		hs, err := HandshakeRefused(endpoint, caFile, id)
		if err != nil {
			return out, fmt.Errorf("handshake as %s: %w", id.Name, err)
		}
		for i, a := range attempts {
			r := Result{Identity: id.Name, What: a.What, Handshake: hs, Refused: hs}
			if !hs || i == 0 {
				text, err := Run(ctx, endpoint, caFile, id, a.Args...)
				r.Output, r.Refused, r.Denied = text, err != nil, strings.Contains(text, "permission denied")
			}
			out = append(out, r)
		}
	}
	return out, ctx.Err()
}
