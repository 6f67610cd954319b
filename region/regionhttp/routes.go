package regionhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// saleJSON is GET /v1/sales/{sale}.
type saleJSON struct {
	Sale         string    `json:"sale_id"`
	Region       string    `json:"region"`
	PerUserLimit int64     `json:"per_user_limit"`
	HoldTTLMs    int64     `json:"hold_ttl_ms"`
	OpensAt      time.Time `json:"opens_at"`
	ServerTime   time.Time `json:"server_time"`
	Paused       bool      `json:"paused"`
	AdmitRate    int64     `json:"admit_rate"`
	TicketTTLMs  int64     `json:"ticket_ttl_ms,omitempty"`
	SKUs         []skuJSON `json:"skus"`
}

type skuJSON struct {
	SKU       string `json:"sku"`
	SoldOut   bool   `json:"sold_out"`
	Paused    bool   `json:"paused"`
	Available int64  `json:"available"`
}

// viewTTL is how long a sale's rendered view is served before it is rendered again; the
// answer says the same in Cache-Control, so caches in front share the one second too.
const viewTTL = time.Second

// viewCache keeps each sale's rendered view for viewTTL: the page every waiting buyer's
// browser refreshes costs one render per second per sale, not one per request. Bounded: it
// starts over when it holds maxViews sales.
type viewCache struct {
	mu    sync.Mutex
	views map[string]renderedView
}

type renderedView struct {
	body []byte
	etag string
	at   time.Time
}

const maxViews = 1024

func newViewCache() *viewCache { return &viewCache{views: map[string]renderedView{}} }

func (h *handler) describe(w http.ResponseWriter, r *http.Request) error {
	sale := r.PathValue("sale")
	now := time.Now()
	h.views.mu.Lock()
	v, ok := h.views.views[sale]
	h.views.mu.Unlock()
	if !ok || now.Sub(v.at) >= viewTTL {
		d, err := h.door()
		if err != nil {
			return err
		}
		view, err := d.Describe(r.Context(), sale)
		if err != nil {
			return err
		}
		body, err := json.Marshal(toSaleJSON(view))
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		v = renderedView{body: append(body, '\n'), etag: `"` + hex.EncodeToString(sum[:8]) + `"`, at: now}
		h.views.mu.Lock()
		if len(h.views.views) >= maxViews {
			clear(h.views.views)
		}
		h.views.views[sale] = v
		h.views.mu.Unlock()
	}
	w.Header().Set("Cache-Control", "public, max-age=1")
	w.Header().Set("ETag", v.etag)
	if r.Header.Get("If-None-Match") == v.etag {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(v.body)))
	_, _ = w.Write(v.body) // a client gone away: nothing to tell it
	return nil
}

// toSaleJSON is a sale's view as the edge answers it; times are in UTC, as every time the
// edge answers.
func toSaleJSON(v region.SaleView) saleJSON {
	t := v.Terms
	out := saleJSON{Sale: t.Sale, Region: v.Region, PerUserLimit: int64(t.PerUserLimit), HoldTTLMs: t.HoldTTL.Milliseconds(),
		OpensAt: t.OpensAt.UTC(), ServerTime: v.ServerTime.UTC(), Paused: v.Paused,
		AdmitRate: t.Admission.Rate, TicketTTLMs: t.Admission.TicketTTL.Milliseconds(), SKUs: make([]skuJSON, 0, len(v.SKUs))}
	for _, k := range v.SKUs {
		out.SKUs = append(out.SKUs, skuJSON{SKU: k.SKU, SoldOut: k.SoldOut, Paused: k.Paused, Available: int64(k.Available)})
	}
	return out
}

// admissionJSON is an admission as the edge answers it.
type admissionJSON struct {
	Admission       string     `json:"admission_id"`
	Sale            string     `json:"sale_id"`
	State           string     `json:"state"`
	Position        int64      `json:"position,omitempty"`
	EstimatedWaitMs int64      `json:"estimated_wait_ms,omitempty"`
	RetryAfterMs    int64      `json:"retry_after_ms,omitempty"`
	Ticket          string     `json:"ticket,omitempty"`
	ExpiresAt       *time.Time `json:"expires_at,omitempty"`
	Region          string     `json:"region,omitempty"`
	SKU             string     `json:"sku,omitempty"`
	Reason          string     `json:"reason,omitempty"`
}

// toAdmissionJSON is an admission as the buyer is told it (region.Admission.Shown); an
// admission with no expiry (queued) has no expires_at rather than the year 1.
func toAdmissionJSON(a region.Admission) admissionJSON {
	out := admissionJSON{Admission: a.ID, Sale: a.Sale, State: string(a.Shown()), Position: int64(a.Position),
		EstimatedWaitMs: a.EstimatedWait.Milliseconds(), RetryAfterMs: a.RetryAfter().Milliseconds(), Ticket: a.Ticket, Region: a.Region,
		SKU: a.SKU, Reason: a.Reason}
	if !a.ExpiresAt.IsZero() {
		t := a.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	return out
}

// writeAdmission answers an admission: 201 once admitted (a ticket), 202 while queued, with
// Retry-After saying when to poll; 200 for the rest.
func writeAdmission(w http.ResponseWriter, a region.Admission, created bool) {
	out := toAdmissionJSON(a)
	code := http.StatusOK
	switch a.Shown() {
	case admission.Queued:
		code = http.StatusAccepted
		w.Header().Set("Retry-After", strconv.FormatInt((out.RetryAfterMs+999)/1000, 10))
	case admission.Admitted:
		if created {
			code = http.StatusCreated
		}
	}
	b := marshalAdmission(&out)
	rpcserve.WriteEncoded(w, code, b, strconv.Itoa(len(b)))
}

func (h *handler) enter(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		User string `json:"user_id"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	d, err := h.door()
	if err != nil {
		return err
	}
	a, err := d.Enter(r.Context(), r.PathValue("sale"), body.User, clientAddress(r))
	if err != nil {
		return err
	}
	writeAdmission(w, a, true)
	return nil
}

func (h *handler) getAdmission(w http.ResponseWriter, r *http.Request) error {
	d, err := h.door()
	if err != nil {
		return err
	}
	a, err := d.GetAdmission(r.Context(), r.PathValue("sale"), r.PathValue("admission"))
	if err != nil {
		return err
	}
	writeAdmission(w, a, false)
	return nil
}

func (h *handler) joinWaitlist(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		User string `json:"user_id"`
		SKU  string `json:"sku"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	d, err := h.door()
	if err != nil {
		return err
	}
	a, err := d.JoinWaitlist(r.Context(), r.PathValue("sale"), body.User, body.SKU)
	if err != nil {
		return err
	}
	writeAdmission(w, a, true)
	return nil
}

// holdJSON is a reservation as the edge answers it.
type holdJSON struct {
	Hold       string    `json:"hold_id"`
	Sale       string    `json:"sale_id"`
	SKU        string    `json:"sku"`
	User       string    `json:"user_id"`
	Quantity   int64     `json:"quantity"`
	RequestKey string    `json:"request_key"`
	State      string    `json:"state"`
	ExpiresAt  time.Time `json:"expires_at"`
	PaymentID  string    `json:"payment_id,omitempty"`
	Region     string    `json:"region"`
	Admission  string    `json:"admission_id,omitempty"`
	CartID     string    `json:"cart_id,omitempty"`
	Replayed   bool      `json:"replayed,omitempty"`
}

// toHoldJSON is a hold as the edge answers it: its state by the name every client sees
// (region.HoldState.String), its expiry in UTC.
func toHoldJSON(h region.Hold) holdJSON {
	return holdJSON{Hold: h.ID, Sale: h.Sale, SKU: h.SKU, User: h.User, Quantity: int64(h.Quantity),
		RequestKey: h.RequestKey, State: h.State.String(), ExpiresAt: h.ExpiresAt.UTC(),
		PaymentID: h.PaymentID, Region: h.Region, Admission: h.Admission, CartID: h.CartID}
}

func toHoldsJSON(hs []region.Hold) []holdJSON {
	out := make([]holdJSON, len(hs))
	for i, h := range hs {
		out[i] = toHoldJSON(h)
	}
	return out
}

func (h *handler) reserve(w http.ResponseWriter, r *http.Request) error {
	var body reserveBody
	if err := decodeReserve(r, &body); err != nil {
		return err
	}
	user := body.User
	var tok *admission.Token
	if body.Ticket != "" {
		if body.User != "" {
			return apierr.Invalid("user_id", "a ticket names its buyer: send one or the other")
		}
		var err error
		if tok, err = admission.ParseToken(body.Ticket); err != nil { // whose ticket: the region verifies it
			return err
		}
		user = tok.Ticket.User
	}
	if body.Lines != nil {
		return h.reserveCart(w, r, &body, user, tok)
	}
	res, err := h.reserveAt(r.Context(), region.ReserveRequest{Sale: r.PathValue("sale"), SKU: body.SKU, User: user,
		Quantity: transfer.Units(body.Quantity), RequestKey: body.RequestKey, Ticket: body.Ticket, Token: tok})
	if err != nil {
		return err
	}
	out := toHoldJSON(res.Hold)
	out.Replayed = res.Replayed
	code := http.StatusCreated
	if out.Replayed {
		code = http.StatusOK
	}
	rpcserve.WriteJSON(w, code, out)
	return nil
}

// cartJSON is a cart as the edge answers it: its id and its holds, one per line in the
// request's order (replayed: an earlier identical request's cart).
type cartJSON struct {
	CartID   string     `json:"cart_id"`
	Holds    []holdJSON `json:"holds"`
	Replayed bool       `json:"replayed,omitempty"`
}

// reserveCart answers a reserve body with lines: 201 and the cart (200 for a replay), or the
// refusal of its first refused line, which names that line's sku.
func (h *handler) reserveCart(w http.ResponseWriter, r *http.Request, body *reserveBody, user string, tok *admission.Token) error {
	switch {
	case body.SKU != "" || body.Quantity != 0:
		return apierr.Invalid("lines", "a cart's lines come in place of sku and quantity: send one or the other")
	case len(body.Lines) > region.MaxCartLines:
		return apierr.Invalid("lines", "%d lines, more than the %d a cart may have", len(body.Lines), region.MaxCartLines)
	}
	lines := make([]region.CartLine, len(body.Lines))
	for i, l := range body.Lines {
		lines[i] = region.CartLine{SKU: l.SKU, Quantity: transfer.Units(l.Quantity)}
	}
	res, err := h.carts.Reserve(r.Context(), region.CartRequest{Sale: r.PathValue("sale"), User: user, RequestKey: body.RequestKey,
		Lines: lines, Ticket: body.Ticket, Token: tok})
	if err != nil {
		return err
	}
	code := http.StatusCreated
	if res.Replayed {
		code = http.StatusOK
	}
	rpcserve.WriteJSON(w, code, cartJSON{CartID: res.CartID, Holds: toHoldsJSON(res.Holds), Replayed: res.Replayed})
	return nil
}

func (h *handler) getCart(w http.ResponseWriter, r *http.Request) error {
	res, err := h.carts.Get(r.Context(), r.PathValue("cart"))
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, cartJSON{CartID: res.CartID, Holds: toHoldsJSON(res.Holds)})
	return nil
}

// cartConfirmJSON is the answer to a cart's confirm: every line sold, or refund the payment
// (no line was sold to it), with the cart's holds as they are now.
type cartConfirmJSON struct {
	Outcome string     `json:"outcome"`
	Reason  string     `json:"reason,omitempty"`
	CartID  string     `json:"cart_id"`
	Holds   []holdJSON `json:"holds"`
}

func (h *handler) confirmCart(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		PaymentID string `json:"payment_id"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	res, err := h.carts.Confirm(r.Context(), r.PathValue("cart"), body.PaymentID)
	if err != nil {
		return err
	}
	out := cartConfirmJSON{Outcome: "refund", Reason: res.Reason, CartID: res.CartID, Holds: toHoldsJSON(res.Holds)}
	if res.Sold {
		out.Outcome = "sold"
	}
	rpcserve.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (h *handler) releaseCart(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength > 0 {
		var body struct{}
		if err := decode(r, &body); err != nil {
			return err
		}
	}
	res, err := h.carts.Release(r.Context(), r.PathValue("cart"))
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, cartJSON{CartID: res.CartID, Holds: toHoldsJSON(res.Holds)})
	return nil
}

func (h *handler) getHold(w http.ResponseWriter, r *http.Request) error {
	hold, err := h.r.GetReservation(r.Context(), r.PathValue("hold"))
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, toHoldJSON(hold))
	return nil
}

// buyerHoldsJSON is GET /v1/sales/{sale}/buyers/{user}/holds: the buyer's holds at this
// region, newest first; truncated when there are more than limit.
type buyerHoldsJSON struct {
	Holds     []holdJSON `json:"holds"`
	Truncated bool       `json:"truncated"`
}

func (h *handler) buyerHolds(w http.ResponseWriter, r *http.Request) error {
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return apierr.Invalid("limit", "%q is not a whole number", v)
		}
		if n < 1 || n > region.MaxBuyerHolds { // an explicit 0 is out of range, not the default
			return apierr.Invalid("limit", "must be 1..%d, got %d", region.MaxBuyerHolds, n)
		}
		limit = n
	}
	holds, truncated, err := h.r.BuyerHolds(r.Context(), r.PathValue("sale"), r.PathValue("user"), limit)
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, buyerHoldsJSON{Holds: toHoldsJSON(holds), Truncated: truncated})
	return nil
}

// confirmJSON is the answer to a confirm: sold, or refund the payment (the hold had
// expired or been released), with the hold as it is now.
type confirmJSON struct {
	Outcome     string   `json:"outcome"`
	Reason      string   `json:"reason,omitempty"`
	Reservation holdJSON `json:"reservation"`
}

func (h *handler) confirm(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		PaymentID string `json:"payment_id"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	res, err := h.r.Confirm(r.Context(), r.PathValue("hold"), body.PaymentID)
	if err != nil {
		return err
	}
	out := confirmJSON{Outcome: "refund", Reason: res.Reason, Reservation: toHoldJSON(res.Hold)}
	if res.Sold {
		out.Outcome = "sold"
	}
	rpcserve.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (h *handler) release(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength > 0 {
		var body struct{}
		if err := decode(r, &body); err != nil {
			return err
		}
	}
	hold, err := h.r.Release(r.Context(), r.PathValue("hold"))
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, toHoldJSON(hold))
	return nil
}
