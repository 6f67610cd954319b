// Package regionhttp is a region's HTTP/JSON edge for storefronts (docs/storefront.md,
// docs/openapi.yaml): every route calls the region's own API (region.Region and its front
// door, region.Door), the same calls the gRPC adapter (regionrpc) makes, so the two APIs run
// the same code, answer the same outcomes and are authorized by the same role table
// (trust.Methods); JSON goes to the region's types and back, never through proto. Errors are
// the region's, in one JSON shape with the status of the one error table (apierr.HTTP).
package regionhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/region"
)

// MaxBody is the most bytes a request body may have.
const MaxBody = 64 << 10

// ClientAddressHeader carries the buyer's address as the storefront saw it, for the
// per-address admission limit. Only a caller with the storefront role's certificate may set
// it; from anyone else (and on a plaintext server) it is ignored and the connection's
// address is used.
const ClientAddressHeader = "X-Client-Address"

// MetricsRoute is the operators' route of the edge: the process's Prometheus metrics
// (Options.Metrics) at trust.MetricsPath, for the roles of trust.MetricsRoles. It is no
// storefront call, so docs/openapi.yaml leaves it out (docs/running.md, "Metrics").
const MetricsRoute = "GET /metrics"

// Options configure the handler.
type Options struct {
	// Insecure serves without authorization (a plaintext server under --insecure); otherwise
	// every route needs a client certificate whose role the table allows.
	Insecure bool
	Logger   *slog.Logger
	// Metrics, when set, is served at GET /metrics (the process's Prometheus metrics), to
	// the roles of trust.MetricsRoles only unless Insecure.
	Metrics http.Handler
}

// Handler serves the storefront API of region r through its front door d (waiting rooms and
// tickets); nil d: a region without one, whose door routes answer CONFLICT
// (region.ErrNoDoor) and whose reservations go to r directly.
func Handler(r *region.Region, d *region.Door, opts Options) http.Handler {
	carts := region.Carts{R: r, D: d}
	if d == nil { // no front door: a nil interface, not a typed nil
		return handlerOf(r, nil, carts, opts)
	}
	return handlerOf(r, d, carts, opts)
}

// handlerOf is Handler over any region and front door (Serve).
func handlerOf(r RegionAPI, d DoorAPI, c CartAPI, opts Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	h := &handler{r: r, d: d, reserveAt: r.Reserve, carts: c, opts: opts, views: newViewCache()}
	if d != nil {
		h.reserveAt = d.Reserve
	}
	mux := http.NewServeMux()
	route := func(pattern, method string, fn func(http.ResponseWriter, *http.Request) error) {
		mux.Handle(pattern, h.wrap(method, fn))
	}
	const svc = "/quota.v1.RegionService/"
	route("GET /v1/ping", svc+"DescribeSale", h.ping)
	route("GET /v1/sales/{sale}", svc+"DescribeSale", h.describe)
	route("POST /v1/sales/{sale}/admissions", svc+"Enter", h.enter)
	route("GET /v1/sales/{sale}/admissions/{admission}", svc+"GetAdmission", h.getAdmission)
	route("POST /v1/sales/{sale}/reservations", svc+"Reserve", h.reserve)
	route("POST /v1/sales/{sale}/waitlist", svc+"JoinWaitlist", h.joinWaitlist)
	route("GET /v1/sales/{sale}/buyers/{user}/holds", svc+"ListBuyerHolds", h.buyerHolds)
	route("GET /v1/holds/{hold}", svc+"GetReservation", h.getHold)
	route("POST /v1/holds/{hold}/confirm", svc+"Confirm", h.confirm)
	route("POST /v1/holds/{hold}/release", svc+"Release", h.release)
	route("GET /v1/carts/{cart}", svc+"GetReservation", h.getCart)
	route("POST /v1/carts/{cart}/confirm", svc+"Confirm", h.confirmCart)
	route("POST /v1/carts/{cart}/release", svc+"Release", h.releaseCart)
	if opts.Metrics != nil {
		mux.Handle(MetricsRoute, h.guard(trust.AuthorizeMetrics, func(w http.ResponseWriter, r *http.Request) error {
			opts.Metrics.ServeHTTP(w, r)
			return nil
		}))
	}
	mux.Handle("/", h.wrap("", func(http.ResponseWriter, *http.Request) error {
		return apierr.NotFound("route", "")
	}))
	return mux
}

type handler struct {
	r RegionAPI
	d DoorAPI
	// reserveAt is d.Reserve, or r.Reserve without a door (as regionrpc.Server.Reserve).
	reserveAt func(context.Context, region.ReserveRequest) (region.ReserveResult, error)
	// carts serves the carts of r, through d.
	carts CartAPI
	opts  Options
	views *viewCache
}

// door is the region's front door, or region.ErrNoDoor without one.
func (h *handler) door() (DoorAPI, error) {
	if h.d == nil {
		return nil, region.ErrNoDoor
	}
	return h.d, nil
}

type callerKey struct{}

// wrap authorizes a route as the gRPC method it stands for ("": the not-found route, open to
// all), bounds its body and writes its error, if any, in the one JSON shape.
func (h *handler) wrap(method string, fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	if method == "" {
		return h.guard(nil, func(w http.ResponseWriter, r *http.Request) error {
			if err := fn(w, r); err != nil {
				return fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, apierr.ErrNotFound)
			}
			return nil
		})
	}
	return h.guard(func(c trust.Caller) error { return trust.AuthorizeCaller(c, method) }, fn)
}

// guard serves fn to the callers authorize allows (nil: everyone; everyone too when
// Insecure), bounds the body and writes fn's error, if any, in the one JSON shape.
func (h *handler) guard(authorize func(trust.Caller) error, fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := trust.CallerOfState(r.TLS)
		if !h.opts.Insecure && authorize != nil {
			if err := authorize(c); err != nil {
				writeError(w, err)
				return
			}
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
		r = r.WithContext(context.WithValue(r.Context(), callerKey{}, c))
		if err := fn(w, r); err != nil {
			writeError(w, err)
		}
	})
}

// writeError answers err in the one JSON shape, with Retry-After on answers that ask to try
// again later.
func writeError(w http.ResponseWriter, err error) {
	a := apierr.AnswerHTTP(err)
	if a.RetryAfter != "" {
		w.Header().Set("Retry-After", a.RetryAfter)
	}
	rpcserve.WriteEncoded(w, a.Status, a.Body, a.Length)
}

// decode reads a JSON body into v: unknown fields and trailing data are refused, naming the
// field, so a typo is an error rather than a silent default.
func decode(r *http.Request, v any) error {
	return decodeFrom(r.Body, v)
}

// decodeFrom is decode of the body read from body.
func decodeFrom(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &mbe):
			return apierr.Invalid("body", "over %d bytes", MaxBody)
		case errors.As(err, &ute) && ute.Field == "":
			return apierr.Invalid("body", "want a JSON object, got %s", ute.Value)
		case errors.As(err, &ute):
			return apierr.Invalid(ute.Field, "want a JSON %s, got %s", ute.Type, ute.Value)
		case errors.Is(err, io.EOF):
			return apierr.Invalid("body", "empty; want a JSON object")
		}
		return apierr.Invalid("body", "%v", err)
	}
	if dec.More() {
		return apierr.Invalid("body", "more than one JSON value")
	}
	return nil
}

// clientAddress is the buyer's address for the per-address limit: the header, from the
// storefront role only; else the connection's address.
func clientAddress(r *http.Request) string {
	c, _ := r.Context().Value(callerKey{}).(trust.Caller)
	if a := r.Header.Get(ClientAddressHeader); a != "" && c.Certified && c.Role == trust.Storefront {
		return a
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (h *handler) ping(w http.ResponseWriter, _ *http.Request) error {
	rpcserve.WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}
