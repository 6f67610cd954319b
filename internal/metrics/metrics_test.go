package metrics_test

import (
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quotaworks/quota/internal/metrics"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/trust"
)

// scrape GETs url with c and returns the status and the body.
func scrape(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// client is an HTTPS client presenting role's certificate ("" for none).
func client(t *testing.T, m *trust.Material, role trust.Role) *http.Client {
	t.Helper()
	r := role
	if r == "" {
		r = trust.Operator
	}
	cfg, err := m.ClientConfig(r)
	if err != nil {
		t.Fatal(err)
	}
	if role == "" {
		cfg.Certificates = nil
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestScrapeNeedsAnOperatorOrAuditor: over mutual TLS, operators and auditors read the
// metrics; a storefront's or the coordinator's certificate is refused 403 and no certificate
// 401, each in the one JSON error shape; other routes are NOT_FOUND.
func TestScrapeNeedsAnOperatorOrAuditor(t *testing.T) {
	m := testcerts.New(t)
	reg := metrics.NewRegistry()
	hs, err := rpcserve.ListenHTTP("127.0.0.1:0", metrics.Serve(reg, false, nil), rpcserve.Options{TLS: m})
	if err != nil {
		t.Fatal(err)
	}
	hs.Start()
	t.Cleanup(hs.Stop)
	url := "https://" + hs.Addr() + trust.MetricsPath
	want := map[trust.Role]int{trust.Operator: 200, trust.Auditor: 200, trust.Storefront: 403, trust.Coordinator: 403, "": 401}
	for role, code := range want {
		got, body := scrape(t, client(t, m, role), url)
		if got != code {
			t.Errorf("role %q: %d %s; want %d", role, got, body, code)
		}
		if code == 200 && !strings.Contains(body, "go_goroutines") {
			t.Errorf("role %q: the scrape has no go_goroutines:\n%s", role, body)
		}
		if code != 200 && !strings.Contains(body, `"code":"`) {
			t.Errorf("role %q: refusal %q is not the JSON error shape", role, body)
		}
	}
	if got, body := scrape(t, client(t, m, trust.Operator), "https://"+hs.Addr()+"/v1/ping"); got != 404 {
		t.Errorf("another route: %d %s; want 404", got, body)
	}
	plain := &http.Client{Timeout: 10 * time.Second}
	if resp, err := plain.Get("http://" + hs.Addr() + trust.MetricsPath); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("a plaintext scrape of a TLS listener was served")
		}
	}
}

// TestInsecureScrapeIsOpen: under --insecure the metrics are served plaintext to anyone.
func TestInsecureScrapeIsOpen(t *testing.T) {
	srv := httptest.NewServer(metrics.Serve(metrics.NewRegistry(), true, nil))
	t.Cleanup(srv.Close)
	if code, body := scrape(t, srv.Client(), srv.URL+trust.MetricsPath); code != 200 || !strings.Contains(body, "process_") {
		t.Errorf("insecure scrape: %d %q", code, body)
	}
}

// TestHTTPMetricsLabelRoutesNotPaths: requests are counted by the pattern that served them
// and their status, so ids in paths never become labels; unmatched requests share one label.
func TestHTTPMetricsLabelRoutesNotPaths(t *testing.T) {
	reg := metrics.NewRegistry()
	hm := metrics.NewHTTP(reg)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/holds/{hold}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("hold") == "missing" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		if _, err := io.WriteString(w, "ok"); err != nil {
			t.Error(err)
		}
	})
	srv := httptest.NewServer(hm.Wrap(mux))
	t.Cleanup(srv.Close)
	for _, p := range []string{"/v1/holds/h-1", "/v1/holds/h-2", "/v1/holds/missing", "/nowhere"} {
		scrape(t, srv.Client(), srv.URL+p)
	}
	want := `
# HELP quota_http_requests_total HTTP requests answered, by route (the pattern that served it) and status code.
# TYPE quota_http_requests_total counter
quota_http_requests_total{code="200",route="GET /v1/holds/{hold}"} 2
quota_http_requests_total{code="404",route="GET /v1/holds/{hold}"} 1
quota_http_requests_total{code="404",route="unmatched"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "quota_http_requests_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "quota_http_request_duration_seconds"); err != nil || n != 2 {
		t.Errorf("%d duration series (%v); want one per route (2)", n, err)
	}
}

// TestConnectionsRefusedAreCounted: a connection a listener's bound closes counts in
// quota_connections_refused_total under the listener and the bound, and every bound's series
// is there from the start.
func TestConnectionsRefusedAreCounted(t *testing.T) {
	m := testcerts.New(t)
	reg := metrics.NewRegistry()
	conns := metrics.NewConnections(reg)
	hs, err := rpcserve.ListenHTTP("127.0.0.1:0", metrics.Serve(reg, false, nil),
		rpcserve.Options{TLS: m, Limits: rpcserve.Limits{MaxConnectionsPerIP: 1}, Refused: conns.Refused("http")})
	if err != nil {
		t.Fatal(err)
	}
	hs.Start()
	defer hs.Stop()
	h, err := testcerts.NewHolder(m, trust.Auditor, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	held, _, err := h.HoldHTTP(hs.Addr(), trust.MetricsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if c, _, err := h.HoldHTTP(hs.Addr(), trust.MetricsPath); err == nil {
		c.Close()
		t.Fatal("a second connection from the address was served past its bound of 1")
	}
	got := map[string]float64{}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "quota_connections_refused_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["listener"]+"/"+labels["limit"]] = s.GetCounter().GetValue()
		}
	}
	want := map[string]float64{}
	for _, r := range rpcserve.Refusals() {
		want["http/"+string(r)] = 0
	}
	want["http/"+string(rpcserve.RefusedPerAddress)] = 1
	if !maps.Equal(got, want) {
		t.Errorf("quota_connections_refused_total by listener/limit: %v, want %v", got, want)
	}
}
