package coordhttp

import (
	"crypto/sha256"
	"embed"
	"fmt"
	"mime"
	"net/http"
	"path"
	"slices"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/trust"
)

//go:embed web
var web embed.FS

// static serves one embedded file of web/.
func (h *handler) static(name string) http.Handler {
	body, err := web.ReadFile("web/" + name)
	if err != nil { // the files are embedded at build time: a programmer error
		panic(fmt.Sprintf("coordhttp: embedded %s: %v", name, err))
	}
	ctype := mime.TypeByExtension(path.Ext(name))
	if ctype == "" || name == "index.html" {
		ctype = "text/html; charset=utf-8"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		secureHeaders(w)
		w.Header().Set("Content-Type", ctype)
		if _, err := w.Write(body); err != nil {
			return // the client went away
		}
	})
}

// sessionJSON is GET api/session and the login's answer: who is logged in and what they
// may do. The page shows action buttons only when CanChange.
type sessionJSON struct {
	Role      string    `json:"role"`
	Name      string    `json:"name"`
	CSRF      string    `json:"csrf,omitempty"`
	Expires   time.Time `json:"expires,omitzero"`
	Insecure  bool      `json:"insecure"`
	CanChange bool      `json:"can_change"`
	Actions   []string  `json:"actions"`
}

func (h *handler) sessionOf(s session) sessionJSON {
	out := sessionJSON{Role: string(s.role), Name: s.name, CSRF: s.csrf, Expires: s.expires, Insecure: h.opts.Insecure, Actions: []string{}}
	for _, a := range []string{ActionView, ActionResolve, ActionRebalance} {
		if slices.Contains(Actions[a], s.role) {
			out.Actions = append(out.Actions, a)
			out.CanChange = out.CanChange || a != ActionView
		}
	}
	return out
}

func (h *handler) session(w http.ResponseWriter, _ *http.Request, s session) error {
	rpcserve.WriteJSON(w, http.StatusOK, h.sessionOf(s))
	return nil
}

// login checks a token and starts a session: the cookie is HttpOnly, Secure and
// SameSite=Strict, scoped to the console, and ends with the session. Logins are rate limited
// (LoginLimits) and sessions bounded (MaxSessionsPerToken, MaxSessionsPerRole).
func (h *handler) login(w http.ResponseWriter, r *http.Request, _ session) error {
	if h.opts.Insecure {
		return h.session(w, r, session{role: trust.Operator, name: "insecure"})
	}
	var req struct {
		Token string `json:"token"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	now := h.opts.Now()
	keys := h.keys()
	if keys == nil {
		return fmt.Errorf("console: this coordinator has no console key file: %w", apierr.ErrUnauthenticated)
	}
	tok, err := VerifyToken(keys, req.Token, now)
	if err != nil {
		if lerr := h.limiter.allowRefused(r.RemoteAddr, now); lerr != nil {
			h.logLimited(lerr, now)
			return lerr
		}
		h.opts.Logger.Info("console login refused", "remote", r.RemoteAddr, "err", err)
		return err
	}
	id := tokenID(sha256.Sum256([]byte(req.Token)))
	if err := h.limiter.allowLogin(tok, id, r.RemoteAddr, now); err != nil {
		h.logLimited(err, now)
		return err
	}
	if h.retired.Load() != keys { // the file changed and its reader did not say so
		h.retireKeys()
	}
	cookie, s, ended, err := h.sessions.create(tok, id, now)
	if err != nil {
		return err
	}
	if h.keys() != keys { // the file changed meanwhile: its sessions end with its keys
		if h.retireKeys(); !h.keyKnown(tok.KeyID) {
			return badToken("key %s left the console key file", tok.KeyID)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: cookie, Path: Prefix, Expires: s.expires,
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	h.opts.Logger.Info("console login", "role", tok.Role, "name", tok.Name, "key", tok.KeyID, "remote", r.RemoteAddr,
		"until", s.expires, "ended_sessions", ended)
	rpcserve.WriteJSON(w, http.StatusOK, h.sessionOf(s))
	return nil
}

// logLimited logs a login refused by a rate limit, at most once a second: a flood of them
// must not flood the log too.
func (h *handler) logLimited(err error, now time.Time) {
	if ok, _ := h.logLimit.Allow("", now); ok {
		h.opts.Logger.Warn("console logins refused by a rate limit (logged at most once a second)", "err", err)
	}
}

// logout ends the request's session, if any, and clears its cookie. It needs the session's
// CSRF token, so another site cannot log an operator out.
func (h *handler) logout(w http.ResponseWriter, r *http.Request, _ session) error {
	if c, err := r.Cookie(CookieName); err == nil {
		s, ok := h.sessions.get(c.Value, h.opts.Now())
		if ok && !s.csrfOK(r.Header.Get(CSRFHeader)) {
			return fmt.Errorf("console: logout needs the session's %s header: %w", CSRFHeader, apierr.ErrPermissionDenied)
		}
		h.sessions.drop(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	rpcserve.WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}
