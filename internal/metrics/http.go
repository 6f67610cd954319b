package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HTTP is one HTTP server's request metrics: quota_http_requests_total{route,code} and the
// quota_http_request_duration_seconds{route} histogram. The route is the ServeMux pattern
// that served the request ("POST /v1/sales/{sale}/reservations"), never its path, so no id
// of a sale, hold or admission becomes a label; a request no pattern matched is "unmatched".
type HTTP struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewHTTP registers the request metrics of one HTTP server on reg.
func NewHTTP(reg prometheus.Registerer) *HTTP {
	m := &HTTP{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quota_http_requests_total",
			Help: "HTTP requests answered, by route (the pattern that served it) and status code."}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "quota_http_request_duration_seconds",
			Help: "Time to answer an HTTP request, by route.", Buckets: LatencyBuckets}, []string{"route"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// Wrap counts and times every request next answers. next must be (or end in) the
// http.ServeMux that routes the request: it names the route on the request itself.
func (m *HTTP) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
		m.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// statusWriter remembers the status code written through it.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer (flush, deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
