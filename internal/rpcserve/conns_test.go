package rpcserve_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/trust"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// refusals counts what a server's Options.Refused hook is told.
type refusals struct {
	mu sync.Mutex
	n  map[rpcserve.Refusal]int
}

func (r *refusals) hook(why rpcserve.Refusal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[rpcserve.Refusal]int{}
	}
	r.n[why]++
}

func (r *refusals) count(why rpcserve.Refusal) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[why]
}

// server is one kind of listener under test: it starts one with opts and holds one idle,
// served connection to it as role from the address from.
type server struct {
	name  string
	start func(t *testing.T, opts rpcserve.Options) string
	hold  func(m *trust.Material, role trust.Role, from, addr string) (net.Conn, error)
}

func servers() []server {
	return []server{
		{"grpc", func(t *testing.T, opts rpcserve.Options) string { return startGRPC(t, opts).Addr() },
			func(m *trust.Material, role trust.Role, from, addr string) (net.Conn, error) {
				h, err := testcerts.NewHolder(m, role, from)
				if err != nil {
					return nil, err
				}
				return h.HoldGRPC(addr)
			}},
		{"http", func(t *testing.T, opts rpcserve.Options) string { return startHTTPWith(t, opts).Addr() },
			func(m *trust.Material, role trust.Role, from, addr string) (net.Conn, error) {
				h, err := testcerts.NewHolder(m, role, from)
				if err != nil {
					return nil, err
				}
				c, code, err := h.HoldHTTP(addr, "/")
				if err == nil && code != http.StatusOK {
					return nil, errors.Join(fmt.Errorf("GET /: %d", code), c.Close())
				}
				return c, err
			}},
	}
}

// holder keeps a test's held connections and closes them at its end.
type holder struct {
	t     *testing.T
	conns []net.Conn
}

func newHolder(t *testing.T) *holder {
	h := &holder{t: t}
	t.Cleanup(func() {
		for _, c := range h.conns {
			c.Close()
		}
	})
	return h
}

// must holds a connection that must be served.
func (h *holder) must(c net.Conn, err error) net.Conn {
	h.t.Helper()
	if err != nil {
		h.t.Fatalf("a connection within the limits: %v", err)
	}
	h.conns = append(h.conns, c)
	return c
}

// refused checks that a connection was not served.
func (h *holder) refused(what string, c net.Conn, err error) {
	h.t.Helper()
	if err == nil {
		h.conns = append(h.conns, c)
		h.t.Errorf("%s: served; want it closed by a limit", what)
	}
}

// TestConnectionsPerAddressAreBounded: on a gRPC and an HTTP server, an address holding
// MaxConnectionsPerIP idle, served connections gets no more (each counted as per_address),
// while another address still does; a close gives the address its slot back.
func TestConnectionsPerAddressAreBounded(t *testing.T) {
	m := testcerts.New(t)
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			var r refusals
			addr := srv.start(t, rpcserve.Options{TLS: m, Limits: rpcserve.Limits{MaxConnectionsPerIP: 4}, Refused: r.hook})
			h := newHolder(t)
			var first net.Conn
			for i := range 4 {
				c := h.must(srv.hold(m, trust.Storefront, "127.0.0.1", addr))
				if i == 0 {
					first = c
				}
			}
			c, err := srv.hold(m, trust.Storefront, "127.0.0.1", addr)
			h.refused("a fifth connection from 127.0.0.1", c, err)
			c, err = srv.hold(m, trust.Auditor, "127.0.0.1", addr)
			h.refused("a sixth, with another certificate", c, err)
			h.must(srv.hold(m, trust.Storefront, "127.0.0.2", addr))
			if n := r.count(rpcserve.RefusedPerAddress); n != 2 {
				t.Errorf("%d refusals per_address counted; want 2", n)
			}
			first.Close()
			waitServed(t, h, func() (net.Conn, error) { return srv.hold(m, trust.Storefront, "127.0.0.1", addr) })
		})
	}
}

// TestConnectionsPerCertificateAreBounded: on a gRPC and an HTTP server, one certificate
// holding MaxConnectionsPerCert connections from several addresses gets no more from any
// (each counted as per_certificate), while another certificate still does; a close gives the
// certificate its slot back.
func TestConnectionsPerCertificateAreBounded(t *testing.T) {
	m := testcerts.New(t)
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			var r refusals
			addr := srv.start(t, rpcserve.Options{TLS: m, Limits: rpcserve.Limits{MaxConnectionsPerIP: 2, MaxConnectionsPerCert: 3}, Refused: r.hook})
			h := newHolder(t)
			first := h.must(srv.hold(m, trust.Storefront, "127.0.0.1", addr))
			h.must(srv.hold(m, trust.Storefront, "127.0.0.1", addr))
			h.must(srv.hold(m, trust.Storefront, "127.0.0.2", addr))
			c, err := srv.hold(m, trust.Storefront, "127.0.0.3", addr)
			h.refused("a fourth connection of the certificate, from a third address", c, err)
			h.must(srv.hold(m, trust.Auditor, "127.0.0.3", addr))
			if n := r.count(rpcserve.RefusedPerCertificate); n != 1 {
				t.Errorf("%d refusals per_certificate counted; want 1", n)
			}
			first.Close()
			waitServed(t, h, func() (net.Conn, error) { return srv.hold(m, trust.Storefront, "127.0.0.3", addr) })
		})
	}
}

// waitServed retries hold until it is served: the server sees a client's close a moment
// after it.
func waitServed(t *testing.T, h *holder, hold func() (net.Conn, error)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := hold()
		if err == nil {
			h.conns = append(h.conns, c)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a close, a new connection: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAnotherAddressIsServedPastTheBound: with one address holding all it may of a gRPC
// server, a client from another address calls it as usual.
func TestAnotherAddressIsServedPastTheBound(t *testing.T) {
	m := testcerts.New(t)
	s := startGRPC(t, rpcserve.Options{TLS: m, Limits: rpcserve.Limits{MaxConnectionsPerIP: 2}})
	h := newHolder(t)
	hold, err := testcerts.NewHolder(m, trust.Storefront, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		h.must(hold.HoldGRPC(s.Addr()))
	}
	creds, err := m.ClientCreds(trust.Storefront)
	if err != nil {
		t.Fatal(err)
	}
	d := testcerts.LocalDialer("127.0.0.2")
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a health check from 127.0.0.2: %v", err)
	}
}
