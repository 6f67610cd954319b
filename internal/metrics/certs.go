package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotaworks/quota/internal/trust"
)

// certExpiry is quota_certificate_expiry_seconds: for each certificate the process holds
// (trust.Material.Held), the seconds from the scrape to its NotAfter, negative once expired.
type certExpiry struct {
	desc *prometheus.Desc
	tls  *trust.Material
	now  func() time.Time
}

// RegisterCertExpiry registers quota_certificate_expiry_seconds{file} for the certificates
// of tls on reg, with labels as constant labels (a node's role and region). An insecure
// process (nil tls) has none, and exports no series.
func RegisterCertExpiry(reg prometheus.Registerer, labels prometheus.Labels, tls *trust.Material) {
	reg.MustRegister(&certExpiry{tls: tls, now: time.Now, desc: prometheus.NewDesc("quota_certificate_expiry_seconds",
		"Seconds until the NotAfter of each certificate this process holds (negative once expired), by file in its certificates directory.",
		[]string{"file"}, labels)})
}

// Describe sends the one metric's description.
func (c *certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect sends one gauge per certificate held.
func (c *certExpiry) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, h := range c.tls.Held() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, h.NotAfter.Sub(now).Seconds(), h.File)
	}
}
