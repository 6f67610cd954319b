package rpcserve_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/trust"
)

func startHTTP(t *testing.T, m *trust.Material, lim rpcserve.Limits) *rpcserve.HTTPServer {
	t.Helper()
	return startHTTPWith(t, rpcserve.Options{TLS: m, Limits: lim})
}

// startHTTPWith is startHTTP with opts.
func startHTTPWith(t *testing.T, opts rpcserve.Options) *rpcserve.HTTPServer {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if trust.CallerOfState(r.TLS).Certified {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	s, err := rpcserve.ListenHTTP("127.0.0.1:0", h, opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// get makes one request on a client of its own (its own connection, kept open after).
func get(t *testing.T, m *trust.Material, addr string, role trust.Role) (int, error) {
	t.Helper()
	cfg, err := m.ClientConfig(trust.Auditor)
	if err != nil {
		t.Fatal(err)
	}
	if role == "" {
		cfg.Certificates = nil
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := c.Get("https://" + addr + "/")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// TestHTTPAnonymousConnectionsHaveABudget: connections without a client certificate are
// served (refused by the handler) up to their budget and closed past it, and a certified
// client still gets in.
func TestHTTPAnonymousConnectionsHaveABudget(t *testing.T) {
	m := testcerts.New(t)
	s := startHTTP(t, m, rpcserve.Limits{MaxAnonymousConnections: 2, MaxConnections: 16})
	served := 0
	for range 4 {
		if code, err := get(t, m, s.Addr(), ""); err == nil && code == http.StatusUnauthorized {
			served++
		}
	}
	if served != 2 {
		t.Errorf("%d of 4 connections without a certificate were served; want the budget of 2", served)
	}
	if code, err := get(t, m, s.Addr(), trust.Auditor); err != nil || code != http.StatusOK {
		t.Errorf("a certified client with the anonymous budget spent: %d %v", code, err)
	}
}

// TestHTTPHandshakesPerAddressAreBounded: connections from one address that never start TLS
// take at most MaxHandshakesPerIP slots; past it they are closed at once.
func TestHTTPHandshakesPerAddressAreBounded(t *testing.T) {
	m := testcerts.New(t)
	s := startHTTP(t, m, rpcserve.Limits{MaxHandshakesPerIP: 3, HandshakeTimeout: 3 * time.Second})
	for range 3 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	time.Sleep(100 * time.Millisecond)                                         // the server has accepted them
	c, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the handshake must fail
	if err == nil {
		c.Close()
		t.Fatal("a fourth connection from the address was let into its handshake")
	}
}

// TestHTTPPublicAsksForNoCertificate: a public listener (a browser's) asks for no client
// certificate, so a certificate offered is not even sent and no caller is certified; its
// connections are not held to the anonymous budget, only to the bounds per address.
func TestHTTPPublicAsksForNoCertificate(t *testing.T) {
	m := testcerts.New(t)
	s := startHTTPWith(t, rpcserve.Options{TLS: m, Public: true,
		Limits: rpcserve.Limits{MaxAnonymousConnections: 2, MaxConnectionsPerIP: 6, MaxConnections: 16}})
	served := 0
	for range 8 {
		if code, err := get(t, m, s.Addr(), ""); err == nil && code == http.StatusUnauthorized {
			served++
		}
	}
	if served != 6 {
		t.Errorf("%d of 8 connections from one address were served; want MaxConnectionsPerIP, 6, not the anonymous budget", served)
	}
	s2 := startHTTPWith(t, rpcserve.Options{TLS: m, Public: true})
	cfg, err := m.ClientConfig(trust.Auditor)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", s2.Addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := len(c.ConnectionState().PeerCertificates); n == 0 {
		t.Fatal("no server certificate")
	}
	if code, err := get(t, m, s2.Addr(), trust.Auditor); err != nil || code != http.StatusUnauthorized {
		t.Errorf("a client offering a certificate to the public listener: %d %v; want it uncertified (401 here)", code, err)
	}
}

// TestHTTPReusePortSharesAnAddress: two servers with ReusePort serve one address (without it
// the second is refused, address in use); once the first stops, the second answers every new
// connection to that address.
func TestHTTPReusePortSharesAnAddress(t *testing.T) {
	m := testcerts.New(t)
	h := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, name) })
	}
	a, err := rpcserve.ListenHTTP("127.0.0.1:0", h("a"), rpcserve.Options{TLS: m, ReusePort: true})
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	t.Cleanup(a.Stop)
	if _, err := rpcserve.ListenHTTP(a.Addr(), h("x"), rpcserve.Options{TLS: m}); err == nil {
		t.Fatalf("a second listener on %s without ReusePort: no error, want the address in use", a.Addr())
	}
	b, err := rpcserve.ListenHTTP(a.Addr(), h("b"), rpcserve.Options{TLS: m, ReusePort: true})
	if err != nil {
		t.Fatalf("a second listener on %s with ReusePort: %v", a.Addr(), err)
	}
	b.Start()
	t.Cleanup(b.Stop)
	cfg, err := m.ClientConfig(trust.Auditor)
	if err != nil {
		t.Fatal(err)
	}
	// askNew makes n requests, each on a connection of its own, and counts who answered.
	askNew := func(n int) map[string]int {
		seen := map[string]int{}
		for range n {
			tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
			resp, err := (&http.Client{Transport: tr, Timeout: 3 * time.Second}).Get("https://" + a.Addr() + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if cerr := resp.Body.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			seen[string(body)]++
		}
		return seen
	}
	if seen := askNew(40); seen["a"] == 0 || seen["b"] == 0 {
		t.Errorf("40 new connections to both: answered %v, want both to answer some", seen)
	}
	a.Stop()
	if seen := askNew(20); seen["b"] != 20 {
		t.Errorf("20 new connections after a stopped: answered %v, want b all 20", seen)
	}
}
