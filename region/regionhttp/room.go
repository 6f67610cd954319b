package regionhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// The waiting-room page (docs/storefront.md, "The waiting-room page"): what a region, or a
// storefront edge of it (ServeRoom), serves shoppers' browsers on a public listener of its
// own, with no client certificate. It serves
// the page, its two static files and the two calls the page makes, nothing else:
//
//	GET  /room/{sale}                          the page (a signed entry link in its query)
//	GET  /room/assets/{room.js,room.css}       its script and style
//	POST /room/{sale}/admissions               enter the line with the entry link
//	GET  /room/{sale}/admissions/{admission}   poll; once admitted, return_to
//
// The page never names the shopper on its own word: entering needs an entry link the store
// signed with the cluster's ticket keys (admission.SignEntry).

//go:embed room/room.html room/room.js room/room.css
var roomFiles embed.FS

var roomPage = template.Must(template.ParseFS(roomFiles, "room/room.html"))

// RoomCSP is the content security policy of every answer of the waiting-room listener: the
// page loads its own script and style only, calls only its own origin, and may not be framed.
const RoomCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// maxRoomBody bounds a room call's body: an entry link's three fields.
const maxRoomBody = 4 << 10

// Return URL parameters: the ticket, the sale and the region that issued it (where the store
// reserves with it).
const (
	ReturnTicket = "ticket"
	ReturnSale   = "sale"
	ReturnRegion = "region"
)

// RoomOptions configure the waiting-room page's handler.
type RoomOptions struct {
	// Region is this region's name, given to the store with the ticket.
	Region string
	// Keys are the cluster's ticket keys, which verify entry links (read at each call, so a
	// rotation applies at once).
	Keys   func() *admission.Keyring
	Logger *slog.Logger
	// Now is the clock entry links are checked by; default time.Now.
	Now func() time.Time
}

// RoomDoor is what the waiting-room page asks of a region's front door: *region.Door, or a
// storefront edge (quotad edge) that answers polls from its copy of the line and forwards
// the rest to the region's leader.
type RoomDoor interface {
	// Terms are a sale's terms: the page asks them only for a signed entry link or an
	// admitted buyer's return URL.
	Terms(ctx context.Context, sale string) (region.SaleTerms, error)
	// Enter puts a buyer in the sale's line, with the address that connected.
	Enter(ctx context.Context, sale, user, addr string) (region.Admission, error)
	// PollAdmission answers a poll from callers no certificate vouches for: from memory
	// only, so a poll naming any sale id costs no query of the region's database.
	PollAdmission(ctx context.Context, sale, id string) (region.Admission, error)
}

// RoomHandler serves the waiting-room page of region's front door d.
func RoomHandler(d *region.Door, opts RoomOptions) (http.Handler, error) {
	if d == nil { // not a typed nil inside the interface
		return nil, errors.New("waiting-room page: needs the front door and the ticket keys (--ticket-keys)")
	}
	return ServeRoom(d, opts)
}

// ServeRoom is RoomHandler over any front door: the same page, files and calls, whoever
// answers behind them.
func ServeRoom(d RoomDoor, opts RoomOptions) (http.Handler, error) {
	if d == nil || opts.Keys == nil {
		return nil, errors.New("waiting-room page: needs the front door and the ticket keys (--ticket-keys)")
	}
	rh, err := newRoomHandler(d, opts)
	if err != nil {
		return nil, err
	}
	return rh.routes(), nil
}

// roomTypes are the static files' content types.
var roomTypes = map[string]string{"room.js": "text/javascript; charset=utf-8", "room.css": "text/css; charset=utf-8"}

// newRoomHandler reads the static files once, with their ETags.
func newRoomHandler(d RoomDoor, opts RoomOptions) (*roomHandler, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	rh := &roomHandler{d: d, opts: opts, assets: map[string]asset{}}
	for name, ctype := range roomTypes {
		b, err := roomFiles.ReadFile("room/" + name)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		rh.assets[name] = asset{body: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`, ctype: ctype}
	}
	return rh, nil
}

// routes is the listener's handler: the page, its files and its calls, each answer with
// the room's headers, bodies bounded.
func (rh *roomHandler) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /room/assets/{file}", rh.asset)
	mux.HandleFunc("GET /room/{sale}", rh.page)
	mux.Handle("POST /room/{sale}/admissions", rh.call(rh.enter))
	mux.Handle("GET /room/{sale}/admissions/{admission}", rh.call(rh.poll))
	mux.Handle("/", rh.call(func(w http.ResponseWriter, r *http.Request) error {
		return fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, apierr.ErrNotFound)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SetRoomHeaders(w.Header())
		r.Body = http.MaxBytesReader(w, r.Body, maxRoomBody)
		mux.ServeHTTP(w, r)
	})
}

// SetRoomHeaders sets what every answer of the waiting-room listener carries: the content
// security policy, no MIME sniffing, no referrer (the page's address holds the entry link),
// no framing and no caching but of the static files.
func SetRoomHeaders(h http.Header) {
	h.Set("Content-Security-Policy", RoomCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

type roomHandler struct {
	d      RoomDoor
	opts   RoomOptions
	assets map[string]asset
}

type asset struct {
	body        []byte
	etag, ctype string
}

// call serves a JSON route, writing its error in the edge's one shape.
func (rh *roomHandler) call(fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			writeError(w, err)
		}
	})
}

func (rh *roomHandler) asset(w http.ResponseWriter, r *http.Request) {
	a, ok := rh.assets[r.PathValue("file")]
	if !ok {
		writeError(w, apierr.NotFound("asset", r.PathValue("file")))
		return
	}
	w.Header().Set("Cache-Control", "no-cache") // revalidate: a new release's files at once
	w.Header().Set("ETag", a.etag)
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", a.ctype)
	w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
	_, _ = w.Write(a.body) // a client gone away: nothing to tell it
}

// page serves the page. With an entry link in the query it checks the link first and, when
// it is refused, says why on the page (400 or 401); without one (a reload: the page took the
// link out of the address) the page carries on with the place the browser kept.
func (rh *roomHandler) page(w http.ResponseWriter, r *http.Request) {
	sale := r.PathValue("sale")
	code, problem := http.StatusOK, ""
	if why := transfer.CheckID(sale); why != "" {
		code, problem = http.StatusNotFound, "There is no such sale: the sale id "+why+"."
	} else if q := r.URL.Query(); q.Has(admission.EntryUser) || q.Has(admission.EntryExp) || q.Has(admission.EntrySig) {
		if _, err := rh.verify(r, sale, q.Get(admission.EntryUser), q.Get(admission.EntryExp), q.Get(admission.EntrySig)); err != nil {
			code, problem = apierr.AnswerHTTP(err).Status, "This link cannot open the waiting room: "+err.Error()+"."
		}
	}
	var b bytes.Buffer
	if err := roomPage.Execute(&b, struct{ Sale, Problem string }{sale, problem}); err != nil {
		rh.opts.Logger.Error("render the waiting-room page", "sale", sale, "err", err)
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes()) // a client gone away: nothing to tell it
}

// verify checks an entry link for sale and that the sale's waiting room can send the shopper
// back (it has a room_return_url), and returns the sale's return URL.
func (rh *roomHandler) verify(r *http.Request, sale, user, exp, sig string) (string, error) {
	e, err := admission.ParseEntry(sale, user, exp, sig)
	if err != nil {
		return "", err
	}
	if err := rh.opts.Keys().VerifyEntry(e, rh.opts.Now()); err != nil {
		return "", err
	}
	t, err := rh.d.Terms(r.Context(), sale) // after the signature: only a signed link reaches the database
	if err != nil {
		return "", err
	}
	if !t.Admission.Waiting() || t.Admission.ReturnURL == "" {
		return "", fmt.Errorf("sale %s has no waiting-room page (no waiting room, or no room_return_url): %w", sale, apierr.ErrConflict)
	}
	return t.Admission.ReturnURL, nil
}

// roomEntry is the body of POST /room/{sale}/admissions: the entry link's fields.
type roomEntry struct {
	User string `json:"user"`
	Exp  string `json:"exp"`
	Sig  string `json:"sig"`
}

func (rh *roomHandler) enter(w http.ResponseWriter, r *http.Request) error {
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/json" {
		return apierr.Invalid("Content-Type", "want application/json")
	}
	var body roomEntry
	if err := decode(r, &body); err != nil {
		return err
	}
	sale := r.PathValue("sale")
	back, err := rh.verify(r, sale, body.User, body.Exp, body.Sig)
	if err != nil {
		return err
	}
	a, err := rh.d.Enter(r.Context(), sale, body.User, remoteHost(r))
	if err != nil {
		return err
	}
	return rh.answer(w, a, back)
}

func (rh *roomHandler) poll(w http.ResponseWriter, r *http.Request) error {
	sale := r.PathValue("sale")
	a, err := rh.d.PollAdmission(r.Context(), sale, r.PathValue("admission")) // memory only: no query for any sale id
	if err != nil {
		return err
	}
	back := ""
	if a.Ticket != "" {
		t, err := rh.d.Terms(r.Context(), sale)
		if err != nil {
			return err
		}
		back = t.Admission.ReturnURL
	}
	return rh.answer(w, a, back)
}

// roomAdmissionJSON is an admission as the page is told it: the edge's admission without the
// ticket, which comes inside return_to once admitted.
type roomAdmissionJSON struct {
	Admission       string     `json:"admission_id"`
	Sale            string     `json:"sale_id"`
	State           string     `json:"state"`
	Position        int64      `json:"position,omitempty"`
	EstimatedWaitMs int64      `json:"estimated_wait_ms,omitempty"`
	RetryAfterMs    int64      `json:"retry_after_ms,omitempty"`
	ExpiresAt       *time.Time `json:"expires_at,omitempty"`
	ReturnTo        string     `json:"return_to,omitempty"`
}

// answer writes an admission as writeAdmission does (202 with Retry-After while queued),
// with return_to once admitted.
func (rh *roomHandler) answer(w http.ResponseWriter, a region.Admission, back string) error {
	j := toAdmissionJSON(a)
	out := roomAdmissionJSON{Admission: j.Admission, Sale: j.Sale, State: j.State, Position: j.Position,
		EstimatedWaitMs: j.EstimatedWaitMs, RetryAfterMs: j.RetryAfterMs, ExpiresAt: j.ExpiresAt}
	code := http.StatusOK
	switch a.Shown() {
	case admission.Queued:
		code = http.StatusAccepted
		w.Header().Set("Retry-After", strconv.FormatInt((out.RetryAfterMs+999)/1000, 10))
	case admission.Admitted:
		if back == "" || a.Ticket == "" {
			return fmt.Errorf("sale %s has no room_return_url: %w", a.Sale, apierr.ErrConflict)
		}
		to, err := ReturnTo(back, a.Ticket, a.Sale, rh.opts.Region)
		if err != nil {
			return err
		}
		out.ReturnTo = to
	}
	rpcserve.WriteJSON(w, code, out)
	return nil
}

// ReturnTo is the address an admitted shopper is sent to: the sale's return URL with the
// ticket, the sale and the region set as query parameters (ReturnTicket, ReturnSale,
// ReturnRegion), replacing any of the same name.
func ReturnTo(back, ticket, sale, regionName string) (string, error) {
	u, err := url.Parse(back)
	if err != nil {
		return "", fmt.Errorf("room_return_url %q: %w", back, err)
	}
	q := u.Query()
	q.Set(ReturnTicket, ticket)
	q.Set(ReturnSale, sale)
	q.Set(ReturnRegion, regionName)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// remoteHost is the connection's address: on the public listener no header may name the
// shopper's address, so the per-address limit counts the address that connected.
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
