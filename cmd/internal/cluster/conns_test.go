package cluster_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/trust"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The attack of TestOneAddressCannotExhaustTheListeners: floodConns connections to each
// listener from one address with one storefront certificate, floodWorkers dialing at once
// (few, so that the bound on handshakes per address is not what refuses them), and the
// time every other client's request must be answered in.
const (
	floodConns   = 1024
	floodWorkers = 8
	probeTimeout = time.Second
	floodFrom    = "127.0.0.1"
	probeFrom    = "127.0.0.2"
)

// floodTarget is one listener of a dev cluster, and how its own metrics name it.
type floodTarget struct {
	name, addr string
	grpc       bool
	path       string // an HTTP listener's: the floodFrom's request
	reg        *prometheus.Registry
	listener   string // quota_connections_refused_total's label
}

// TestOneAddressCannotExhaustTheListeners: one address holding 1,024 idle TLS connections
// with one storefront certificate on every listener of a dev cluster (a region's gRPC port
// and storefront HTTP edge, the coordinator's gRPC port and its HTTP listener of the console
// and metrics) is held to MaxConnectionsPerIP of each, every connection past it closed at
// once and counted in quota_connections_refused_total; meanwhile clients from a second
// address are answered by every listener within a second.
func TestOneAddressCannotExhaustTheListeners(t *testing.T) {
	d := startDev(t, "us")
	r := d.Regions[0]
	targets := []floodTarget{
		{"region gRPC", r.Addr(), true, "", r.Metrics, "grpc"},
		{"storefront HTTP edge", r.HTTPAddr(), false, "/v1/ping", r.Metrics, "http"},
		{"coordinator gRPC", d.Coordinator.Addr(), true, "", d.Coordinator.Metrics, "grpc"},
		{"coordinator console and metrics", d.Coordinator.HTTPAddr(), false, trust.MetricsPath, d.Coordinator.Metrics, "http"},
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	start := time.Now()
	served := map[string]int{}
	for _, tg := range targets {
		before := refusedOf(t, tg.reg, tg.listener)
		conns := holdAll(t, tg)
		held = append(held, conns...)
		served[tg.name] = len(conns)
		if len(conns) == 0 || len(conns) > rpcserve.DefaultLimits.MaxConnectionsPerIP {
			t.Errorf("%s: %d of %d connections from one address served; want 1..%d", tg.name, len(conns), floodConns, rpcserve.DefaultLimits.MaxConnectionsPerIP)
		}
		after := refusedOf(t, tg.reg, tg.listener)
		if n := after[rpcserve.RefusedPerAddress] - before[rpcserve.RefusedPerAddress]; n < 1 {
			t.Errorf("%s: quota_connections_refused_total{listener=%q,limit=\"per_address\"} rose by %v; want the flood counted", tg.name, tg.listener, n)
		}
		var refused float64
		for limit, n := range after {
			refused += n - before[limit]
		}
		if want := float64(floodConns - len(conns)); refused != want {
			t.Errorf("%s: quota_connections_refused_total{listener=%q} rose by %v (%v); want %v, every connection not served", tg.name, tg.listener, refused, after, want)
		}
	}
	t.Logf("flood of %d connections to each of %d listeners from %s: %v served, in %v", floodConns, len(targets), floodFrom, served, time.Since(start).Round(time.Millisecond))
	probeGRPC(t, "region gRPC", r.Addr(), trust.Storefront)
	probeGRPC(t, "coordinator gRPC", d.Coordinator.Addr(), trust.Operator)
	probeHTTP(t, "storefront HTTP edge", "https://"+r.HTTPAddr()+"/v1/ping", trust.Storefront)
	probeHTTP(t, "region metrics", "https://"+r.HTTPAddr()+trust.MetricsPath, trust.Auditor)
	probeHTTP(t, "coordinator console", "https://"+d.Coordinator.HTTPAddr()+"/console/", trust.Operator)
	probeHTTP(t, "coordinator metrics", "https://"+d.Coordinator.HTTPAddr()+trust.MetricsPath, trust.Auditor)
}

// holdAll opens floodConns connections to tg from the floodFrom's address with the storefront
// certificate, floodWorkers at a time, and returns those served, still open.
func holdAll(t *testing.T, tg floodTarget) []net.Conn {
	t.Helper()
	h, err := testcerts.NewHolder(certs, trust.Storefront, floodFrom)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		out  []net.Conn
		wg   sync.WaitGroup
		work = make(chan struct{})
	)
	for range floodWorkers {
		wg.Go(func() {
			for range work {
				var c net.Conn
				var err error
				if tg.grpc {
					c, err = h.HoldGRPC(tg.addr)
				} else {
					c, _, err = h.HoldHTTP(tg.addr, tg.path)
				}
				if err == nil {
					mu.Lock()
					out = append(out, c)
					mu.Unlock()
				}
			}
		})
	}
	for range floodConns {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	return out
}

// refusedOf reads quota_connections_refused_total of listener from reg, by limit.
func refusedOf(t *testing.T, reg *prometheus.Registry, listener string) map[rpcserve.Refusal]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[rpcserve.Refusal]float64{}
	for _, f := range fams {
		if f.GetName() != "quota_connections_refused_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["listener"] == listener {
				out[rpcserve.Refusal(labels["limit"])] = m.GetCounter().GetValue()
			}
		}
	}
	if len(out) != len(rpcserve.Refusals()) {
		t.Fatalf("quota_connections_refused_total{listener=%q}: %v; want a series for each of %v", listener, out, rpcserve.Refusals())
	}
	return out
}

// probeGRPC checks that a new connection from the probeFrom's address to the gRPC server at
// addr, as role, has its health check answered within probeTimeout.
func probeGRPC(t *testing.T, name, addr string, role trust.Role) {
	t.Helper()
	d := testcerts.LocalDialer(probeFrom)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds(t, role)),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	start := time.Now()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("%s from %s during the flood: %v after %v", name, probeFrom, err, time.Since(start))
	}
}

// probeHTTP checks that a GET of url on a new connection from the probeFrom's address, as
// role, is answered 200 within probeTimeout.
func probeHTTP(t *testing.T, name, url string, role trust.Role) {
	t.Helper()
	cfg, err := certs.ClientConfig(role)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, DisableKeepAlives: true, DialContext: testcerts.LocalDialer(probeFrom).DialContext}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: probeTimeout}
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		t.Errorf("%s from %s during the flood: %v after %v", name, probeFrom, err, time.Since(start))
		return
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("%s from %s during the flood: %s %v; want 200", name, probeFrom, resp.Status, err)
	}
}
