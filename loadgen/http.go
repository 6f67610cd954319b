package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/quotaworks/quota/internal/clock"
)

// HTTPEdge sends Run's buyers through the regions' storefront HTTP/JSON edges
// (docs/storefront.md): each buyer enters its region's waiting room, polls its admission when
// told to (retry_after_ms), reserves with the ticket it is given, then pays, cancels or walks
// away as in gRPC mode.
type HTTPEdge struct {
	// Client makes every call. Give it the storefront role's client certificate: the edge
	// honours X-Client-Address (each buyer's own synthetic address, so the per-address limit
	// sees distinct buyers) from that role only. Required.
	Client *http.Client
	// Bases are the edges' base URLs by region name ("us" → "https://127.0.0.1:8401"), one
	// for every region of Config.Regions.
	Bases map[string]string
	// More are further base URLs of a region's edges (several edges of one region, each at
	// its own address): buyer n of the region goes to the (n mod k)-th of Bases[r] followed
	// by More[r], k of them, and stays there, as a storefront's session does. Optional.
	More map[string][]string
	// Waitlist, when positive, is how long a buyer the waiting room tells SOLD_OUT waits on
	// the SKU's waitlist at its region for an offer (units that came back: a release, an
	// expiry), reserving with the offer's ticket like any other; it stops waiting earlier
	// when the sale's page says the SKU is sold out for good. Zero: a SOLD_OUT buyer leaves.
	Waitlist time.Duration
}

// ErrEdgeUnreachable is Run's error, in HTTP mode, when a region's edge does not answer its
// ping before the run: a wrong URL, certificate or role, or a server not running.
var ErrEdgeUnreachable = errors.New("storefront edge unreachable")

// clientAddressHeader is the edge's header for the buyer's address (regionhttp's
// ClientAddressHeader).
const clientAddressHeader = "X-Client-Address"

// callTimeout bounds one call; maxAnswer, the bytes of an answer read.
const (
	callTimeout = 10 * time.Second
	maxAnswer   = 1 << 20
)

func (h *HTTPEdge) validate(regions []Region) error {
	if h.Client == nil {
		return errors.New("loadgen: HTTP mode without an http.Client")
	}
	for _, r := range regions {
		if h.Bases[r.Name] == "" {
			return fmt.Errorf("loadgen: HTTP mode: no edge URL for region %s", r.Name)
		}
		if len(h.More[r.Name]) >= maxEdges {
			return fmt.Errorf("loadgen: HTTP mode: %d edge URLs for region %s; at most %d", len(h.More[r.Name])+1, r.Name, maxEdges)
		}
		for _, u := range h.More[r.Name] {
			if u == "" {
				return fmt.Errorf("loadgen: HTTP mode: an empty further edge URL for region %s", r.Name)
			}
		}
	}
	return nil
}

// maxEdges bounds the edge URLs of one region.
const maxEdges = 64

// edges are region r's edge URLs: Bases[r], then More[r].
func (h *HTTPEdge) edges(r string) []string {
	return append([]string{h.Bases[r]}, h.More[r]...)
}

// ping checks that every edge of every region answers GET /v1/ping with this client.
func (h *HTTPEdge) ping(ctx context.Context, regions []Region) error {
	for _, r := range regions {
		for _, base := range h.edges(r.Name) {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := edgeDo(pctx, h.Client, http.MethodGet, base+"/v1/ping", "", nil, nil)
			cancel()
			if err != nil {
				return fmt.Errorf("loadgen: region %s: %w at %s: %w", r.Name, ErrEdgeUnreachable, base, err)
			}
		}
	}
	return nil
}

// edgeError is an edge's answer other than a success: its status and its error body
// ({"error": {"code", "message", "field", "retry_after_ms", "region"}}).
type edgeError struct {
	method, path string
	status       int
	Code         string        `json:"code"`
	Message      string        `json:"message"`
	Field        string        `json:"field"`
	RetryAfterMs int64         `json:"retry_after_ms"`
	Region       string        `json:"region"`
	retryAfter   time.Duration // from retry_after_ms, else the Retry-After header
}

func (e *edgeError) Error() string {
	msg := fmt.Sprintf("%s %s: %d %s: %s", e.method, e.path, e.status, e.Code, e.Message)
	if e.Field != "" {
		msg += " (field " + e.Field + ")"
	}
	if e.Region != "" {
		msg += " (region " + e.Region + ")"
	}
	return msg
}

// edgeDo makes one call: body (if any) as JSON, addr (if any) in X-Client-Address, a 2xx
// answer decoded into out (if any); any other answer is an *edgeError.
func edgeDo(ctx context.Context, c *http.Client, method, u, addr string, body, out any) (err error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if addr != "" {
		req.Header.Set(clientAddressHeader, addr)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := resp.Body.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return answerError(req, resp, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: %d answer: %w", method, req.URL.Path, resp.StatusCode, err)
	}
	return nil
}

// answerError is a non-2xx answer as an *edgeError.
func answerError(req *http.Request, resp *http.Response, data []byte) error {
	var body struct {
		Error edgeError `json:"error"`
	}
	e := &body.Error
	if err := json.Unmarshal(data, &body); err != nil || e.Code == "" {
		*e = edgeError{Code: http.StatusText(resp.StatusCode), Message: string(bytes.TrimSpace(data))}
	}
	e.method, e.path, e.status = req.Method, req.URL.Path, resp.StatusCode
	e.retryAfter = time.Duration(e.RetryAfterMs) * time.Millisecond
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); e.retryAfter == 0 && err == nil && s > 0 {
		e.retryAfter = time.Duration(s) * time.Second
	}
	return e
}

// edgeReason is the error's REASON (SOLD_OUT, OVERLOADED, ...): the code of an edge's
// answer; "" for a call that got no answer.
func edgeReason(err error) string {
	var e *edgeError
	if errors.As(err, &e) {
		if e.status == http.StatusTooManyRequests && e.Code != "TOO_MANY_KEYS" {
			return "OVERLOADED"
		}
		return e.Code
	}
	return ""
}

// edgeRetryable is an outcome a real storefront retries with the same request: no answer
// (but for a certificate the other side refused), the outcome unknown, a region between
// leaders, or a full queue (429, after its Retry-After).
func edgeRetryable(err error) bool {
	var e *edgeError
	if !errors.As(err, &e) {
		var op *net.OpError // "remote error": the server's TLS alert, as for a certificate it refused
		var verify *tls.CertificateVerificationError
		var unknownCA x509.UnknownAuthorityError
		return !(errors.As(err, &op) && op.Op == "remote error") && !errors.As(err, &verify) && !errors.As(err, &unknownCA)
	}
	switch edgeReason(err) {
	case "UNKNOWN_OUTCOME", "NOT_LEADER", "OVERLOADED":
		return true
	}
	return e.status == http.StatusBadGateway || e.status == http.StatusServiceUnavailable || e.status == http.StatusGatewayTimeout
}

// httpBuyer is one buyer in HTTP mode.
type httpBuyer struct {
	cfg               *Config
	c                 *counters
	region, base      string
	rng               *rand.Rand
	user, addr, sales string        // sales: the sale's path, /v1/sales/{sale}
	pollFloor         time.Duration // the least pause between polls (a waitlist's: a second)
}

func newHTTPBuyer(cfg *Config, c *counters, region string, rng *rand.Rand, n int64) httpBuyer {
	edges := cfg.HTTP.edges(region)
	return httpBuyer{cfg: cfg, c: c, region: region, base: edges[n%int64(len(edges))], rng: rng,
		user: fmt.Sprintf("%sbuyer-%d", cfg.UserPrefix, n), addr: syntheticAddress(n),
		sales: "/v1/sales/" + url.PathEscape(cfg.Sale)}
}

// syntheticAddress is buyer n's client address: one per buyer (10.0.0.0/8, then wrapping),
// so the edge's per-address limit models distinct buyers, not one storefront.
func syntheticAddress(n int64) string {
	return fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255)
}

// do is one call to the buyer's edge with its address.
func (b httpBuyer) do(ctx context.Context, method, path string, body, out any) error {
	return edgeDo(ctx, b.cfg.HTTP.Client, method, b.base+path, b.addr, body, out)
}

// call retries fn as buyer.call does: outcomes a storefront cannot tell from success or
// failure, and OVERLOADED after its retry-after, with the same request, at most
// maxAttempts times.
func (b httpBuyer) call(ctx context.Context, fn func(context.Context) error) error {
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			b.c.retries.Add(1)
			if edgeReason(err) == "OVERLOADED" {
				b.c.throttled.Add(1)
			}
			var e *edgeError
			wait := min(time.Duration(attempt*attempt)*20*time.Millisecond, 500*time.Millisecond)
			if errors.As(err, &e) {
				wait = max(wait, e.retryAfter)
			}
			if clock.Sleep(ctx, wait) != nil {
				return err
			}
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err = fn(cctx)
		cancel()
		if err == nil || ctx.Err() != nil || !edgeRetryable(err) {
			return err
		}
	}
	return err
}

func (b httpBuyer) run(ctx context.Context) {
	b.c.buyers.Add(1)
	ticket, err := b.admit(ctx, b.enterRoom, nil)
	if edgeReason(err) == "SOLD_OUT" && b.cfg.HTTP.Waitlist > 0 {
		ticket, err = b.waitlist(ctx)
	}
	switch {
	case errors.Is(err, errWaitedOut):
		b.c.waitedOut.Add(1)
		return
	case errors.Is(err, errUsedAdmission):
		b.c.earlier.Add(1)
		return
	case err != nil:
		b.c.refuse(b.region, edgeReason(err), err)
		return
	}
	b.c.admitted.Add(1)
	var h struct {
		Hold     string `json:"hold_id"`
		Quantity int64  `json:"quantity"`
		Replayed bool   `json:"replayed"`
	}
	tries := 0
	err = b.call(ctx, func(ctx context.Context) error {
		tries++
		return b.do(ctx, http.MethodPost, b.sales+"/reservations", map[string]any{"ticket": ticket, "sku": b.cfg.SKU,
			"quantity": int64(b.cfg.Quantity), "request_key": "checkout-1"}, &h)
	})
	switch {
	case err != nil:
		b.c.refuse(b.region, edgeReason(err), err)
	case h.Replayed && tries == 1: // an earlier run's hold, as in gRPC mode
		b.c.earlier.Add(1)
	default:
		b.c.grant(b.region, h.Hold, h.Quantity)
		settle(ctx, b.cfg, b.c, b.rng, h.Hold, "pay-"+b.user, b)
	}
}

// errUsedAdmission: the buyer's admission was used already, by an earlier run with the same
// buyer ids.
var errUsedAdmission = errors.New("admission used by an earlier run")

// admissionAnswer is an admission as the edge answers it (the fields a buyer reads).
type admissionAnswer struct {
	ID           string `json:"admission_id"`
	State        string `json:"state"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Ticket       string `json:"ticket"`
}

// maxEntries bounds how often a buyer enters again: after its ticket expired unused, or
// after its admission was forgotten (a new region leader starts its rooms empty).
const maxEntries = 3

// admit enters (the waiting room, or a waitlist) and follows the answers to a ticket: a
// queued admission is polled when its retry_after_ms says, until admitted, until check (if
// set, before each poll) says to stop, or until ctx ends.
func (b httpBuyer) admit(ctx context.Context, enter func(context.Context, *admissionAnswer) error,
	check func(context.Context) error) (string, error) {
	var a admissionAnswer
	for entries := 0; ; {
		if a.ID == "" {
			if entries++; entries > maxEntries {
				return "", fmt.Errorf("admission of buyer %s at %s: entered %d times without a ticket", b.user, b.region, maxEntries)
			}
			if err := enter(ctx, &a); err != nil {
				return "", err
			}
		}
		switch a.State {
		case "admitted":
			if a.Ticket == "" {
				return "", fmt.Errorf("admission %s at %s: admitted without a ticket", a.ID, b.region)
			}
			return a.Ticket, nil
		case "used":
			return "", errUsedAdmission
		case "expired":
			a = admissionAnswer{} // enter again
			continue
		case "queued":
		default:
			return "", fmt.Errorf("admission %s at %s: unexpected state %q", a.ID, b.region, a.State)
		}
		if check != nil {
			if err := check(ctx); err != nil {
				return "", err
			}
		}
		if err := b.poll(ctx, &a); err != nil {
			return "", err
		}
	}
}

// enterRoom asks the sale's waiting room at the buyer's region for a place.
func (b httpBuyer) enterRoom(ctx context.Context, a *admissionAnswer) error {
	return b.call(ctx, func(ctx context.Context) error {
		return b.do(ctx, http.MethodPost, b.sales+"/admissions", map[string]string{"user_id": b.user}, a)
	})
}

// poll waits as the queued admission a says (a quarter second if it does not; at least
// pollFloor), then reads it again; an admission the region no longer knows is cleared, to
// enter again.
func (b httpBuyer) poll(ctx context.Context, a *admissionAnswer) error {
	wait := time.Duration(a.RetryAfterMs) * time.Millisecond
	if wait <= 0 {
		wait = 250 * time.Millisecond
	}
	wait = max(wait, b.pollFloor)
	wait = min(wait, 5*time.Second) + rand.N(wait/10+1) // jitter: polls of buyers queued together spread
	if clock.Sleep(ctx, wait) != nil {
		return fmt.Errorf("buyer %s still queued at %s when the run ended: %w", b.user, b.region, ctx.Err())
	}
	b.c.polls.Add(1)
	id := a.ID
	err := b.call(ctx, func(ctx context.Context) error {
		return b.do(ctx, http.MethodGet, b.sales+"/admissions/"+url.PathEscape(id), nil, a)
	})
	if edgeReason(err) == "NOT_FOUND" {
		*a = admissionAnswer{}
		return nil
	}
	return err
}

func (b httpBuyer) confirm(ctx context.Context, hold, payment string) (bool, error) {
	var res struct {
		Outcome string `json:"outcome"`
	}
	err := b.call(ctx, func(ctx context.Context) error {
		return b.do(ctx, http.MethodPost, "/v1/holds/"+url.PathEscape(hold)+"/confirm", map[string]string{"payment_id": payment}, &res)
	})
	return res.Outcome == "sold", err
}

func (b httpBuyer) release(ctx context.Context, hold string) error {
	return b.call(ctx, func(ctx context.Context) error {
		return b.do(ctx, http.MethodPost, "/v1/holds/"+url.PathEscape(hold)+"/release", nil, nil)
	})
}
