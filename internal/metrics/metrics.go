// Package metrics is what every quotad process's Prometheus metrics share: a registry of its
// own (never the global default, so tests can run several processes in one binary), the
// /metrics handler and its authorization (trust.MetricsRoles), the HTTP servers' request
// metrics and the gRPC servers' (go-grpc-middleware's Prometheus provider). The metrics of
// the domain (reservations, pools, transfers, ...) are registered by the process's wiring
// (cmd/internal/cluster); docs/running.md lists them all.
package metrics

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
)

// LatencyBuckets are the buckets of every request-duration histogram, in seconds: from half
// a millisecond (a reserve answered from memory) to ten seconds.
var LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// NewRegistry returns a registry for one process, with the Go runtime's and the process's
// own collectors (go_*, process_*).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// scrapeTimeout bounds one scrape's collection: the collectors that read a database use
// their own, shorter, timeouts.
const scrapeTimeout = 10 * time.Second

// Handler serves reg's metrics in Prometheus's text format, to whoever reaches it: mount it
// behind Authorized (or the HTTP edge's own check of trust.MetricsRoles). A collector that
// fails is logged and left out; the others are served.
func Handler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: printer{log}, ErrorHandling: promhttp.ContinueOnError,
		Registry: reg, MaxRequestsInFlight: 4, Timeout: scrapeTimeout})
}

// Authorized serves h only to a verified client certificate of a role in
// trust.MetricsRoles, unless insecure (a plaintext listener under --insecure); a refusal is
// answered in the HTTP edge's one JSON error shape: 401 without a certificate, 403 for
// another role.
func Authorized(h http.Handler, insecure bool) http.Handler {
	if insecure {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := trust.AuthorizeMetrics(trust.CallerOfState(r.TLS)); err != nil {
			WriteError(w, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Serve is the whole handler of a listener that serves only metrics (the coordinator's HTTP
// listener): GET /metrics, Authorized, and NOT_FOUND for every other route.
func Serve(reg *prometheus.Registry, insecure bool, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+trust.MetricsPath, Authorized(Handler(reg, log), insecure))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, apierr.ErrNotFound))
	})
	return mux
}

// WriteError answers err in the HTTP edge's one JSON error shape (apierr.HTTP).
func WriteError(w http.ResponseWriter, err error) {
	code, body := apierr.HTTP(err)
	b, merr := json.Marshal(body)
	if merr != nil { // an ErrorBody always marshals: a programmer error
		panic(fmt.Sprintf("metrics: marshal an error body: %v", merr))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	if _, err := w.Write(append(b, '\n')); err != nil {
		return // the client went away; nothing to tell it
	}
}

// printer logs promhttp's collection errors.
type printer struct{ log *slog.Logger }

func (p printer) Println(v ...any) { p.log.Warn("metrics: " + fmt.Sprint(v...)) }

// NewGRPC registers the gRPC server metrics of go-grpc-middleware's Prometheus provider on
// reg (grpc_server_started_total, grpc_server_handled_total{grpc_code},
// grpc_server_msg_received_total, grpc_server_msg_sent_total and the
// grpc_server_handling_seconds histogram, by service and method) and returns them: pass their
// interceptors to the server (rpcserve.Options), then InitializeMetrics once its services
// are registered.
func NewGRPC(reg prometheus.Registerer) *grpcprom.ServerMetrics {
	m := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(LatencyBuckets)))
	reg.MustRegister(m)
	return m
}
