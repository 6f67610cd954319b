// Package coordhttp is the coordinator's web console for operators and auditors
// (docs/console.md): pages embedded in the binary, and a JSON API they poll, served on the
// coordinator's HTTP listener beside /metrics. A browser has no client certificate, so the
// console logs in with a token quotactl signs with the console key (token.go) and keeps a
// session cookie; every change is checked against the session's role (Actions) and carries
// its CSRF token. Under --insecure there is no login and everyone is an operator. Errors are
// the one JSON shape of the one error table (apierr.HTTP).
package coordhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/transfer"
)

// Prefix is where the console is served; every route is under it.
const Prefix = "/console/"

// MaxBody bounds a request body: the largest is a login with its token.
const MaxBody = 4 << 10

// CSRFHeader carries a session's CSRF token on every change.
const CSRFHeader = "X-CSRF-Token"

// The console's actions. ActionView reads every page and the JSON behind it; the others
// change stock.
const (
	ActionView      = "view"
	ActionResolve   = "resolve"
	ActionRebalance = "rebalance"
)

// Actions is who may do what on the console, by the role of the login. An auditor sees
// everything and changes nothing. docs/security.md prints it; TestActions pins it.
var Actions = map[string][]trust.Role{
	ActionView:      {trust.Operator, trust.Auditor},
	ActionResolve:   {trust.Operator},
	ActionRebalance: {trust.Operator},
}

// Backend is what the console reads and does: the coordinator (*coordinator.Coordinator).
type Backend interface {
	ListSales(ctx context.Context, limit int) ([]coordinator.SaleSummary, error)
	GetSale(ctx context.Context, sale string) (coordinator.Sale, error)
	RecentTransfers(ctx context.Context, sale string, limit int) ([]transfer.Transfer, error)
	Regions() []coordinator.RegionLink
	Rebalance(ctx context.Context, req coordinator.RebalanceRequest) (coordinator.RebalanceResult, error)
	PlanRebalance(ctx context.Context, sale string) (coordinator.SalePlan, error)
	Resolve(ctx context.Context, id string, refuse bool) (transfer.Transfer, error)
	Audit(ctx context.Context, sale string) (coordinator.Report, error)
	AuditViolations() int64
	AuditedAt() time.Time
	AuditHistory(ctx context.Context, q coordinator.AuditHistoryQuery) ([]coordinator.AuditRound, int64, error)
	RecordAction(ctx context.Context, a transfer.Action) (transfer.Action, error)
	Generation() (int64, error)
}

var _ Backend = (*coordinator.Coordinator)(nil)

// Options configure the console.
type Options struct {
	// Insecure serves without login: everyone is an operator (a plaintext server under
	// --insecure). Otherwise every route but the page itself and the login needs a session.
	Insecure bool
	// Keys returns the console key file as last read (the keys that verify login tokens);
	// nil, or nil keys, refuses every login. Whoever reads the file again calls
	// Console.KeysChanged, so the sessions of keys it no longer holds end at once.
	Keys   func() *admission.Keyring
	Logger *slog.Logger
	// Now tells the time; default time.Now.
	Now func() time.Time
	// Limits bound how fast logins may come; nil is DefaultLoginLimits.
	Limits *LoginLimits
	// Status gathers the cluster's status for the front page (GET api/status); nil: none.
	Status func(ctx context.Context) (coordinator.ClusterStatus, error)
}

// Console serves the console under Prefix and keeps its sessions.
type Console struct {
	h   *handler
	mux *http.ServeMux
}

// New makes the console. The error is an *apierr.InvalidError naming a bad field of
// opts.Limits.
func New(b Backend, opts Options) (*Console, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	lim := DefaultLoginLimits
	if opts.Limits != nil {
		lim = *opts.Limits
	}
	limiter, err := newLoginLimiter(lim)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	h := &handler{b: b, opts: opts, sessions: newSessions(MaxSessionsPerToken, MaxSessionsPerRole), views: newViewCache(),
		limiter: limiter, logLimit: admission.NewLimiter(1, 1, 1)}
	return &Console{h: h, mux: h.routes()}, nil
}

// ServeHTTP serves one request of the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.mux.ServeHTTP(w, r) }

// Sessions is how many sessions the console keeps, by role.
func (c *Console) Sessions() map[trust.Role]int { return c.h.sessions.count() }

// KeysChanged ends every session whose token's key is not in the key file as Options.Keys
// returns it now, and says how many it ended: the key file's reader calls it after each
// read, so a replaced file (quotactl console keys create --overwrite) or a second rotation
// empties the table of the retired key's sessions at once, not as each is next used.
func (c *Console) KeysChanged() int { return c.h.retireKeys() }

func (h *handler) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET "+Prefix+"{$}", h.static("index.html"))
	mux.Handle("GET "+Prefix+"app.js", h.static("app.js"))
	mux.Handle("GET "+Prefix+"style.css", h.static("style.css"))
	mux.Handle("POST "+Prefix+"api/login", h.open(h.login))
	mux.Handle("POST "+Prefix+"api/logout", h.open(h.logout))
	mux.Handle("GET "+Prefix+"api/session", h.allowed(ActionView, h.session))
	mux.Handle("GET "+Prefix+"api/overview", h.allowed(ActionView, h.overview))
	mux.Handle("GET "+Prefix+"api/status", h.allowed(ActionView, h.status))
	mux.Handle("GET "+Prefix+"api/sales/{sale}", h.allowed(ActionView, h.saleView))
	mux.Handle("POST "+Prefix+"api/transfers/{id}/resolve", h.allowed(ActionResolve, h.resolve))
	mux.Handle("POST "+Prefix+"api/sales/{sale}/rebalance", h.allowed(ActionRebalance, h.rebalance))
	mux.Handle(Prefix, h.open(func(w http.ResponseWriter, r *http.Request, _ session) error {
		return fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, apierr.ErrNotFound)
	}))
	return mux
}

type handler struct {
	b        Backend
	opts     Options
	sessions *sessions
	views    *viewCache
	limiter  *loginLimiter
	logLimit *admission.Limiter // the log of rate-limited logins: a line a second at most
	// retired is the key file whose retired keys' sessions were ended last, so that a login
	// ends them too when the file changed and nobody called KeysChanged.
	retired atomic.Pointer[admission.Keyring]
}

type route func(w http.ResponseWriter, r *http.Request, s session) error

// open serves fn to everyone (the login, the logout, the not-found answer), with the
// console's headers, a bounded body and, on a POST, the same-origin checks.
func (h *handler) open(fn route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secureHeaders(w)
		r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
		if r.Method == http.MethodPost {
			if err := sameOrigin(r); err != nil {
				writeError(w, err)
				return
			}
		}
		if err := fn(w, r, session{}); err != nil {
			writeError(w, err)
		}
	})
}

// allowed serves fn to the sessions whose role may do action (everyone under Insecure); a
// POST must also carry the session's CSRF token.
func (h *handler) allowed(action string, fn route) http.Handler {
	return h.open(func(w http.ResponseWriter, r *http.Request, _ session) error {
		s, err := h.caller(r)
		if err != nil {
			return err
		}
		if err := authorize(s, action); err != nil {
			return err
		}
		if r.Method == http.MethodPost && !h.opts.Insecure && !s.csrfOK(r.Header.Get(CSRFHeader)) {
			return fmt.Errorf("console: %s needs the session's %s header: %w", action, CSRFHeader, apierr.ErrPermissionDenied)
		}
		return fn(w, r, s)
	})
}

// caller is the request's session: under Insecure everyone is an operator.
func (h *handler) caller(r *http.Request) (session, error) {
	if h.opts.Insecure {
		return session{role: trust.Operator, name: "insecure"}, nil
	}
	c, err := r.Cookie(CookieName)
	if err == nil {
		if s, ok := h.sessions.get(c.Value, h.opts.Now()); ok {
			if h.keyKnown(s.keyID) {
				return s, nil
			}
			h.sessions.drop(c.Value) // its key left the key file: the session ends with it
		}
	}
	return session{}, fmt.Errorf("console: log in with a token from quotactl console token: %w", apierr.ErrUnauthenticated)
}

// keys is the console key file as last read, or nil.
func (h *handler) keys() *admission.Keyring {
	if h.opts.Keys == nil {
		return nil
	}
	return h.opts.Keys()
}

// keyKnown reports whether the console key file still holds the key id.
func (h *handler) keyKnown(id string) bool { return slices.Contains(h.keys().IDs(), id) }

// retireKeys ends the sessions whose key the key file no longer holds and says how many.
func (h *handler) retireKeys() int {
	k := h.keys()
	h.retired.Store(k)
	ids := k.IDs()
	n := h.sessions.retire(func(id string) bool { return slices.Contains(ids, id) })
	if n > 0 {
		h.opts.Logger.Info("console sessions of retired keys ended", "sessions", n, "keys", ids)
	}
	return n
}

// authorize decides one action of a session by Actions.
func authorize(s session, action string) error {
	for _, r := range Actions[action] {
		if s.role == r {
			return nil
		}
	}
	role := string(s.role)
	if role == "" {
		role = "none"
	}
	return fmt.Errorf("role %s (console login %q) may not %s: %w", role, s.name, action, apierr.ErrPermissionDenied)
}

// sameOrigin refuses a POST that a page of another site could have sent: its body must be
// JSON (a cross-site form cannot send that without a preflight the console never answers),
// and the browser's Origin and Sec-Fetch-Site, when sent, must say this site.
func sameOrigin(r *http.Request) error {
	deny := func(why string) error {
		return fmt.Errorf("console: cross-site request refused (%s): %w", why, apierr.ErrPermissionDenied)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return deny("the body must be application/json")
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return deny("Sec-Fetch-Site " + site)
	}
	if o := r.Header.Get("Origin"); o != "" {
		scheme := "https://"
		if r.TLS == nil {
			scheme = "http://"
		}
		if o != scheme+r.Host {
			return deny("Origin is another site")
		}
	}
	return nil
}

// secureHeaders are on every answer: no framing, no inline script, no sniffing, no caching.
func secureHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// writeError answers err in the one JSON error shape, with Retry-After when it asks to try
// again later.
func writeError(w http.ResponseWriter, err error) {
	a := apierr.AnswerHTTP(err)
	if a.RetryAfter != "" {
		w.Header().Set("Retry-After", a.RetryAfter)
	}
	rpcserve.WriteEncoded(w, a.Status, a.Body, a.Length)
}

// decode reads a JSON body into v, refusing unknown fields and trailing data.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return apierr.Invalid("body", "over %d bytes", MaxBody)
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
