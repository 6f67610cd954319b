package metrics_test

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quotaworks/quota/internal/metrics"
	"github.com/quotaworks/quota/internal/trust"
)

// TestCertificateExpiry: quota_certificate_expiry_seconds has one series per certificate the
// process loaded, by file, worth the seconds to its NotAfter; insecure, none.
func TestCertificateExpiry(t *testing.T) {
	dir := t.TempDir()
	if err := trust.CreateCA(dir, false, trust.ValidFor(20*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateNode(dir, []string{"localhost"}, false, trust.ValidFor(10*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	m, err := trust.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ServerConfig(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics.RegisterCertExpiry(reg, prometheus.Labels{"role": "region", "region": "us"}, m)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if f.GetName() != "quota_certificate_expiry_seconds" || labels["role"] != "region" || labels["region"] != "us" {
				t.Errorf("unexpected series %s %v", f.GetName(), labels)
			}
			got[labels["file"]] = s.GetGauge().GetValue()
		}
	}
	for file, days := range map[string]float64{"ca.crt": 20, "node.crt": 10} {
		if want := days * 86400; math.Abs(got[file]-want) > 120 {
			t.Errorf("%s: %v seconds; want about %v", file, got[file], want)
		}
	}
	if len(got) != 2 {
		t.Errorf("series %v; want ca.crt and node.crt", got)
	}
	insecure := prometheus.NewRegistry()
	metrics.RegisterCertExpiry(insecure, nil, nil)
	if n, err := testutil.GatherAndCount(insecure); err != nil || n != 0 {
		t.Errorf("insecure: %d series, %v; want none", n, err)
	}
}
