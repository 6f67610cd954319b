package cluster

import (
	"context"
	"errors"
	"strings"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/metrics"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/region"
)

// The metrics of every node are docs/running.md's "Metrics" table; a change here changes it
// too, and deploy/grafana/quota.json and deploy/prometheus/alerts.yml name only metrics that
// TestMetricsOfADevCluster finds exported.

// Roles of quota_leader and quota_takeover_seconds.
const (
	roleRegion      = "region"
	roleCoordinator = "coordinator"
	// roleEdge is a storefront edge's (quotad edge), which leads nothing.
	roleEdge = "edge"
)

// collectTimeout bounds a scrape's read of a database (the region's pools, the ledger's
// open transfers): a slow database costs a scrape its series, never a stuck scrape.
const collectTimeout = 2 * time.Second

// takeoverBuckets are quota_takeover_seconds's buckets: a warm takeover takes milliseconds,
// a full load of a large region tens of seconds.
var takeoverBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// nodeMetrics is one node's registry (a process's: never the global default, so a test can
// run several nodes in one binary) and what every node registers on it.
type nodeMetrics struct {
	reg      *prometheus.Registry
	grpc     *grpcprom.ServerMetrics
	http     *metrics.HTTP
	conns    *metrics.Connections
	takeover prometheus.Histogram
	labels   prometheus.Labels // role and region
	// off leaves the gRPC server without the metrics' interceptors (RegionConfig.NoMetrics).
	off bool
}

// newNodeMetrics makes a node's registry: the Go and process collectors, the gRPC and HTTP
// servers' metrics, quota_takeover_seconds for role (and region, a region's name or ""), and
// quota_certificate_expiry_seconds for the certificates of tls the process holds.
func newNodeMetrics(role, regionName string, tls *trust.Material) *nodeMetrics {
	reg := metrics.NewRegistry()
	m := &nodeMetrics{reg: reg, grpc: metrics.NewGRPC(reg), http: metrics.NewHTTP(reg), conns: metrics.NewConnections(reg), labels: prometheus.Labels{"role": role, "region": regionName}}
	metrics.RegisterCertExpiry(reg, m.labels, tls)
	m.takeover = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quota_takeover_seconds", ConstLabels: m.labels, Buckets: takeoverBuckets,
		Help: "Time from winning the role's election to serving as its leader (fence raised, state loaded)."})
	reg.MustRegister(m.takeover)
	return m
}

// leader registers quota_leader, read from leading on each scrape.
func (m *nodeMetrics) leader(leading func() bool) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quota_leader", ConstLabels: m.labels,
		Help: "1 while this process leads the role (a region's or the coordinator's), else 0."}, func() float64 {
		if leading() {
			return 1
		}
		return 0
	}))
}

// database registers the state of the node's own database, read on each scrape:
// quota_database_up (a ping within collectTimeout answered) and
// quota_database_connections_opened_total (pgxpool's connections opened since start: a step
// after a database failover is the node reconnecting to the new primary).
func (m *nodeMetrics) database(db *pgxpool.Pool) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quota_database_up", ConstLabels: m.labels,
		Help: "1 when this process's own database answered a ping within 2 s at this scrape, else 0."}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
		defer cancel()
		if db.Ping(ctx) != nil {
			return 0
		}
		return 1
	}), prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quota_database_connections_opened_total", ConstLabels: m.labels,
		Help: "Connections this process opened to its own database since it started: a step after a failover is the reconnection to the new primary."},
		func() float64 { return float64(db.Stat().NewConnsCount()) }))
}

// Listener names of quota_connections_refused_total: the gRPC server, and the HTTP listener
// (a region's storefront edge, the coordinator's console and metrics).
const (
	listenerGRPC = "grpc"
	listenerHTTP = "http"
)

// serverOptions adds the gRPC metrics' interceptors and the connections refused to opts.
func (m *nodeMetrics) serverOptions(opts rpcserve.Options) rpcserve.Options {
	opts.Refused = m.conns.Refused(listenerGRPC)
	if m.off {
		return opts
	}
	opts.Unary = append(opts.Unary, m.grpc.UnaryServerInterceptor())
	opts.Stream = append(opts.Stream, m.grpc.StreamServerInterceptor())
	return opts
}

// httpOptions adds the connections refused of the HTTP listener to opts.
func (m *nodeMetrics) httpOptions(opts rpcserve.Options) rpcserve.Options {
	opts.Refused = m.conns.Refused(listenerHTTP)
	return opts
}

// tookOver observes one takeover.
func (m *nodeMetrics) tookOver(d time.Duration) { m.takeover.Observe(d.Seconds()) }

// regionMetrics is region.Metrics on Prometheus: reservations by outcome, the writer's batches
// and the fences' refusals, each series made at the start so that rates start at zero.
type regionMetrics struct {
	reserved    map[string]prometheus.Counter // by apierr.ReasonOf ("" for a hold)
	batchSize   prometheus.Histogram
	batchCommit prometheus.Histogram
	fenced      map[string]prometheus.Counter
}

var _ region.Metrics = (*regionMetrics)(nil)

// newRegionMetrics registers a region's metrics on reg: those it counts (regionMetrics), its
// failed batches, and its pools as committed (poolCollector).
func newRegionMetrics(reg prometheus.Registerer, name string) *regionMetrics {
	labels := prometheus.Labels{"region": name}
	reservations := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quota_reservations_total", ConstLabels: labels,
		Help: "Reserve calls answered, by outcome: ok (a hold, a replayed one too) or the refusal's reason in lower case (sold_out, region_exhausted, ...)."},
		[]string{"outcome"})
	fences := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quota_fence_rejections_total", ConstLabels: labels,
		Help: "Writes a fence refused (I4): epoch, a batch of a deposed leader; generation, a coordinator request below the sale's generation."},
		[]string{"fence"})
	m := &regionMetrics{reserved: map[string]prometheus.Counter{"": reservations.WithLabelValues("ok")},
		fenced: map[string]prometheus.Counter{},
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quota_batch_size", ConstLabels: labels,
			Help: "Operations per batch the region's writer committed.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		batchCommit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quota_batch_commit_seconds", ConstLabels: labels,
			Help: "Time from applying a batch's first operation to its commit's answer.", Buckets: metrics.LatencyBuckets}),
	}
	for _, r := range apierr.Reasons() {
		m.reserved[r] = reservations.WithLabelValues(strings.ToLower(r))
	}
	for _, f := range []string{region.FenceEpoch, region.FenceGeneration} {
		m.fenced[f] = fences.WithLabelValues(f)
	}
	reg.MustRegister(reservations, fences, m.batchSize, m.batchCommit)
	return m
}

// Reserved counts one Reserve's answer.
func (m *regionMetrics) Reserved(err error) {
	c, ok := m.reserved[apierr.ReasonOf(err)]
	if !ok { // every reason was made at the start: a new one is counted as INTERNAL
		c = m.reserved["INTERNAL"]
	}
	c.Inc()
}

// BatchCommitted observes one committed batch.
func (m *regionMetrics) BatchCommitted(ops int, took time.Duration) {
	m.batchSize.Observe(float64(ops))
	m.batchCommit.Observe(took.Seconds())
}

// Fenced counts one refusal of fence.
func (m *regionMetrics) Fenced(fence string) {
	if c, ok := m.fenced[fence]; ok {
		c.Inc()
	}
}

// registerRegion registers what is read from a running region: its failed batches and its
// pools.
func registerRegion(reg prometheus.Registerer, r *region.Region) {
	labels := prometheus.Labels{"region": r.Name()}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quota_batch_failures_total", ConstLabels: labels,
		Help: "The writer's batches that failed, each of which made the leader reload its state from SQL or step down."},
		func() float64 { return float64(r.BatchFailures()) }),
		&poolCollector{r: r, desc: prometheus.NewDesc("quota_pool_units",
			"Units of each pool, as its region's leader committed them, by state: available, held, sold.",
			[]string{"sale", "sku", "state"}, labels)})
}

// poolCollector reads quota_pool_units from the region on each scrape (region.AllPools, one
// query), on the leader only: a standby's series would count the region's units twice.
type poolCollector struct {
	r    *region.Region
	desc *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.r.Leading() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	pools, err := c.r.AllPools(ctx)
	if errors.Is(err, region.ErrNotLeader) { // stepped down since
		return
	}
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, p := range pools {
		for _, s := range []struct {
			state string
			units int64
		}{{"available", int64(p.Available)}, {"held", int64(p.Held)}, {"sold", int64(p.Sold)}} {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(s.units), p.Sale, p.SKU, s.state)
		}
	}
}

// registerCoordinator registers the coordinator's metrics: its fence's refusals, and what the
// leader reads of its ledger (ledgerCollector).
func registerCoordinator(reg prometheus.Registerer, c *coordinator.Coordinator) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quota_fence_rejections_total",
		ConstLabels: prometheus.Labels{"fence": "ledger"},
		Help:        "Ledger transactions the generation fence refused (I4): a newer coordinator had written."},
		func() float64 { return float64(c.FenceRejections()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quota_rebalance_moves_total",
			Help: "Transfers the automatic rebalancer started while this process led."},
			func() float64 { n, _ := c.AutoMoves(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quota_rebalance_units_total",
			Help: "Units the automatic rebalancer's transfers moved while this process led."},
			func() float64 { _, u := c.AutoMoves(); return float64(u) }),
		&ledgerCollector{c: c,
			transfers: prometheus.NewDesc("quota_transfers", "Unfinished transfers in the ledger, by state: requested, pending, stranded, unsettled.",
				[]string{"state"}, nil),
			stranded: prometheus.NewDesc("quota_stranded_units", "Units of the stranded transfers: in no region's pool until resolved.", nil, nil),
			audit: prometheus.NewDesc("quota_audit_violations",
				"Violations the continuous audit found in its last round (0 before the first).", nil, nil),
			audited: prometheus.NewDesc("quota_audit_last_run_timestamp_seconds",
				"When the continuous audit's last round ended (Unix time); absent before the first.", nil, nil),
			auditTook: prometheus.NewDesc("quota_audit_last_duration_seconds",
				"How long the continuous audit's last round took (every sale read and evaluated), a round that failed included; absent before the first.", nil, nil)})
}

// ledgerCollector reads the ledger's open transfers on each scrape (one query, over the rows
// the transfer driver reads every round anyway) and the continuous audit's last count, on
// the leading coordinator only.
type ledgerCollector struct {
	c                                              *coordinator.Coordinator
	transfers, stranded, audit, audited, auditTook *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (l *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.transfers
	ch <- l.stranded
	ch <- l.audit
	ch <- l.audited
	ch <- l.auditTook
}

// Collect implements prometheus.Collector.
func (l *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	if _, err := l.c.Generation(); err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(l.audit, prometheus.GaugeValue, float64(l.c.AuditViolations()))
	if at := l.c.AuditedAt(); !at.IsZero() {
		ch <- prometheus.MustNewConstMetric(l.audited, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
	}
	if took := l.c.AuditDuration(); took > 0 {
		ch <- prometheus.MustNewConstMetric(l.auditTook, prometheus.GaugeValue, took.Seconds())
	}
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	counts, err := l.c.OpenTransfers(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(l.transfers, err)
		return
	}
	for _, tc := range counts {
		ch <- prometheus.MustNewConstMetric(l.transfers, prometheus.GaugeValue, float64(tc.Count), tc.State)
		if tc.State == coordinator.TransferStranded {
			ch <- prometheus.MustNewConstMetric(l.stranded, prometheus.GaugeValue, float64(tc.Units))
		}
	}
}
