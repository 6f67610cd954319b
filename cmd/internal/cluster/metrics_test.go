package cluster_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"go.yaml.in/yaml/v3"
)

// The operators' files whose queries must name only exported metrics, from this package's
// directory.
const (
	dashboardFile = "../../../deploy/grafana/quota.json"
	alertsFile    = "../../../deploy/prometheus/alerts.yml"
)

// families is one scrape, by metric family name.
type families map[string]*dto.MetricFamily

// scrapeMetrics GETs url's /metrics with c and parses it; it fails the test unless the
// answer is 200 in Prometheus's text format.
func scrapeMetrics(t *testing.T, c *http.Client, base string) families {
	t.Helper()
	resp, err := c.Get(base + trust.MetricsPath)
	if err != nil {
		t.Fatalf("scrape %s: %v", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", base, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", base, err)
	}
	return fams
}

// value is the value of the one series of name whose labels include want (counter, gauge,
// or a histogram's count), and whether there is one.
func (f families) value(name string, want map[string]string) (float64, bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		ok := true
		for k, v := range want {
			ok = ok && slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v })
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// names adds the names of f's series to set: a histogram's as Prometheus stores them
// (_bucket, _sum, _count) and its family's.
func (f families) names(set map[string]bool) {
	for name, fam := range f {
		set[name] = true
		if fam.GetType() == dto.MetricType_HISTOGRAM || fam.GetType() == dto.MetricType_SUMMARY {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				set[name+s] = true
			}
		}
	}
}

// metricName finds the metric names a query uses: those of the project and of the
// libraries the processes export (gRPC, Go, process, promhttp). Prometheus's own (up) are
// not the processes' to export.
var metricName = regexp.MustCompile(`\b(?:quota|grpc_server|go|process|promhttp)_[a-zA-Z0-9_]+`)

// queriedMetrics returns every metric name the dashboard's and the alert rules' queries name.
func queriedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && (k == "expr" || k == "query") {
					for _, n := range metricName.FindAllString(s, -1) {
						used[n] = append(used[n], dashboardFile)
					}
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(dash)
	raw, err = os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, n := range metricName.FindAllString(r.Expr, -1) {
				used[n] = append(used[n], alertsFile+" "+r.Alert+r.Record)
			}
		}
	}
	if len(used) < 10 {
		t.Fatalf("the dashboard and the alerts name %d metrics: %v; did their format change?", len(used), used)
	}
	return used
}

// startMetricsDev is startDev with a fast continuous audit, so quota_audit_violations has a
// round to report.
func startMetricsDev(t *testing.T, regions ...string) *cluster.Dev {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := "quota_t_" + randHex(t)
	d, err := cluster.StartDev(ctx, cluster.DevConfig{Regions: regions, PGURL: testpg.AdminURL(), DBPrefix: prefix,
		DataDir: t.TempDir(), Host: "127.0.0.1", LeaseTTL: 2 * time.Second, Logger: testLogger(), Region: region.Config{Verify: verify()},
		CertsDir: certs.Dir(), AuditInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		dropDBs(t, prefix, regions)
	})
	return d
}

// TestMetricsOfADevCluster scrapes every process of a dev cluster with the operator's
// certificate, as deploy/prometheus/prometheus.yml does: every metric the Grafana dashboard
// and the alert rules name is exported, and the values move with what the cluster does (a
// reservation counts as ok, an empty pool as region_exhausted; the pools match GetStock; the
// leaders say so). Other roles are refused.
func TestMetricsOfADevCluster(t *testing.T) {
	d := startMetricsDev(t, "us", "eu")
	ctx := context.Background()
	op := httpClient(t, trust.Operator)
	coordURL := "https://" + d.Coordinator.HTTPAddr()
	usURL, euURL := edgeURL(d, "us"), edgeURL(d, "eu")
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, coord, "m1", 4) // 2 phones a region, 5 a buyer
	before := scrapeMetrics(t, op, usURL)

	us := quotav1.NewRegionServiceClient(dial(t, d.Regions[0].Addr(), trust.Storefront))
	if _, err := us.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "m1", Sku: "phone", UserId: "u1", Quantity: 2, RequestKey: "k1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := us.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "m1", Sku: "phone", UserId: "u2", Quantity: 1, RequestKey: "k1"}); err == nil {
		t.Fatal("a third phone at us, whose pool had two")
	}
	if a := call(t, httpClient(t, trust.Storefront), "GET", usURL+"/v1/ping", nil); a.code != 200 {
		t.Fatalf("ping: %d %v", a.code, a.body)
	}
	waitFor(t, "an audit round", 10*time.Second, func() bool {
		_, ok := scrapeMetrics(t, op, coordURL).value("quota_audit_last_run_timestamp_seconds", nil)
		return ok
	})

	scraped := map[string]families{"coordinator": scrapeMetrics(t, op, coordURL), "us": scrapeMetrics(t, op, usURL),
		"eu": scrapeMetrics(t, op, euURL)}
	exported := map[string]bool{}
	for _, f := range scraped {
		f.names(exported)
	}
	for name, where := range queriedMetrics(t) {
		if !exported[name] {
			t.Errorf("%s (in %v) is exported by no process", name, where)
		}
	}
	for _, u := range []string{coordURL, usURL, euURL} {
		promtoolCheck(t, op, u)
	}
	checkRegionValues(t, before, scraped["us"], us)
	checkCoordinatorValues(t, scraped["coordinator"])
	checkCertificateExpiry(t, scraped)
	checkScrapeRoles(t, coordURL, usURL)
}

// checkRegionValues checks the region us's metrics after one reservation of 2 and one
// refused for an empty pool.
func checkRegionValues(t *testing.T, before, after families, us quotav1.RegionServiceClient) {
	t.Helper()
	for outcome, n := range map[string]float64{"ok": 1, "region_exhausted": 1, "sold_out": 0} {
		b, _ := before.value("quota_reservations_total", map[string]string{"region": "us", "outcome": outcome})
		a, ok := after.value("quota_reservations_total", map[string]string{"region": "us", "outcome": outcome})
		if !ok || a-b != n {
			t.Errorf("quota_reservations_total{outcome=%q} went from %v to %v (exported %v); want +%v", outcome, b, a, ok, n)
		}
	}
	st, err := us.GetStock(context.Background(), &quotav1.GetStockRequest{SaleId: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.GetPools() {
		for state, want := range map[string]int64{"available": p.GetAvailable(), "held": p.GetHeld(), "sold": p.GetSold()} {
			got, ok := after.value("quota_pool_units", map[string]string{"region": "us", "sale": "m1", "sku": p.GetSku(), "state": state})
			if !ok || got != float64(want) {
				t.Errorf("quota_pool_units{sku=%q,state=%q} = %v (exported %v); GetStock says %d", p.GetSku(), state, got, ok, want)
			}
		}
	}
	if len(st.GetPools()) != 1 || st.GetPools()[0].GetHeld() != 2 {
		t.Errorf("us's pools %v; want one phone pool with 2 held", st.GetPools())
	}
	for name, labels := range map[string]map[string]string{
		"quota_leader":               {"role": "region", "region": "us"},
		"quota_takeover_seconds":     {"role": "region", "region": "us"},
		"quota_batch_size":           {"region": "us"},
		"quota_batch_commit_seconds": {"region": "us"},
		"grpc_server_handled_total":  {"grpc_method": "Reserve", "grpc_code": "OK"},
		"quota_http_requests_total":  {"route": "GET /v1/ping", "code": "200"},
	} {
		if v, ok := after.value(name, labels); !ok || v < 1 {
			t.Errorf("%s%v = %v (exported %v); want at least 1", name, labels, v, ok)
		}
	}
	for _, fam := range after {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if slices.Contains([]string{"user", "user_id", "hold", "hold_id", "admission", "ticket", "request_key"}, l.GetName()) {
					t.Errorf("%s has a label %s: its values are unbounded", fam.GetName(), l.GetName())
				}
			}
		}
	}
}

// checkCoordinatorValues checks the coordinator's metrics of a cluster with nothing wrong.
func checkCoordinatorValues(t *testing.T, f families) {
	t.Helper()
	for name, want := range map[string]float64{"quota_leader": 1, "quota_stranded_units": 0, "quota_audit_violations": 0} {
		if got, ok := f.value(name, nil); !ok || got != want {
			t.Errorf("coordinator %s = %v (exported %v); want %v", name, got, ok, want)
		}
	}
	if got, ok := f.value("quota_audit_last_duration_seconds", nil); !ok || got <= 0 || got > 10 {
		t.Errorf("coordinator quota_audit_last_duration_seconds = %v (exported %v); want the last round's time, above 0 and under 10 s", got, ok)
	}
	for _, state := range []string{"requested", "pending", "stranded", "unsettled"} {
		if got, ok := f.value("quota_transfers", map[string]string{"state": state}); !ok || got != 0 {
			t.Errorf("quota_transfers{state=%q} = %v (exported %v); want 0: the allocation's transfers all finished", state, got, ok)
		}
	}
	if v, ok := f.value("grpc_server_handled_total", map[string]string{"grpc_method": "Allocate", "grpc_code": "OK"}); !ok || v != 1 {
		t.Errorf("the coordinator's Allocate calls: %v (exported %v); want 1", v, ok)
	}
}

// checkCertificateExpiry: every process reports the seconds left of ca.crt and node.crt,
// and the coordinator those of the client certificate it calls the regions with.
func checkCertificateExpiry(t *testing.T, scraped map[string]families) {
	t.Helper()
	for process, f := range scraped {
		files := []string{trust.CACert, trust.NodeCert}
		if process == "coordinator" {
			files = append(files, trust.ClientCert(trust.Coordinator, ""))
		}
		for _, file := range files {
			got, ok := f.value("quota_certificate_expiry_seconds", map[string]string{"file": file})
			if !ok || got < (trust.CertLifetime-48*time.Hour).Seconds() || got > trust.CALifetime.Seconds() {
				t.Errorf("%s: quota_certificate_expiry_seconds{file=%q} = %v (exported %v); want about its lifetime", process, file, got, ok)
			}
		}
	}
}

// checkScrapeRoles: /metrics is the operators' and auditors' only.
func checkScrapeRoles(t *testing.T, urls ...string) {
	t.Helper()
	for _, u := range urls {
		scrapeMetrics(t, httpClient(t, trust.Auditor), u)
		for role, code := range map[trust.Role]int{trust.Storefront: 403, trust.Coordinator: 403, "": 401} {
			a := call(t, httpClient(t, role), "GET", u+trust.MetricsPath, nil)
			if a.code != code || !strings.Contains(a.errCode(), "UNAUTHENTICATED") && !strings.Contains(a.errCode(), "PERMISSION_DENIED") {
				t.Errorf("%s/metrics as %q: %d %v; want %d", u, role, a.code, a.body, code)
			}
		}
	}
}

// promtoolCheck runs Prometheus' own linter, promtool check metrics, on one process's
// /metrics: names, units, help texts and types as Prometheus' conventions want them. make test
// installs promtool first (scripts/promtool.sh --install); a run elsewhere without it skips
// this check, and CI fails for it.
func promtoolCheck(t *testing.T, c *http.Client, base string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("promtool is missing (scripts/promtool.sh --install): %v", err)
		}
		t.Logf("promtool check metrics skipped: promtool not installed (scripts/promtool.sh --install)")
		return
	}
	resp, err := c.Get(base + trust.MetricsPath)
	if err != nil {
		t.Fatalf("scrape %s: %v", base, err)
	}
	defer resp.Body.Close()
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = resp.Body
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on %s: %v\n%s", base, err, out)
	}
}
