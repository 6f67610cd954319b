package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotaworks/quota/internal/rpcserve"
)

// Connections is one process's quota_connections_refused_total{listener,limit}: the
// connections a bound of a listener closed (rpcserve.Limits), by the listener ("grpc",
// "http") and the bound (rpcserve.Refusals: total, per_address, per_certificate, handshake,
// anonymous).
type Connections struct{ refused *prometheus.CounterVec }

// NewConnections registers quota_connections_refused_total on reg.
func NewConnections(reg prometheus.Registerer) *Connections {
	c := &Connections{refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quota_connections_refused_total",
		Help: "Connections a listener closed because a bound was reached, by listener and bound: total, per_address, per_certificate, handshake (per address), anonymous (without a client certificate)."},
		[]string{"listener", "limit"})}
	reg.MustRegister(c.refused)
	return c
}

// Refused is the Options.Refused hook of the listener named listener, every one of its
// series made at 0 so that rates start there.
func (c *Connections) Refused(listener string) func(rpcserve.Refusal) {
	counters := map[rpcserve.Refusal]prometheus.Counter{}
	for _, r := range rpcserve.Refusals() {
		counters[r] = c.refused.WithLabelValues(listener, string(r))
	}
	return func(r rpcserve.Refusal) {
		if n, ok := counters[r]; ok {
			n.Inc()
		}
	}
}
