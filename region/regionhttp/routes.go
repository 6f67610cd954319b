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
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
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
		resp, err := h.s.DescribeSale(r.Context(), &quotav1.DescribeSaleRequest{SaleId: sale})
		if err != nil {
			return err
		}
		body, err := json.Marshal(toSaleJSON(resp))
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

func toSaleJSON(s *quotav1.DescribeSaleResponse) saleJSON {
	out := saleJSON{Sale: s.GetSaleId(), Region: s.GetRegion(), PerUserLimit: s.GetPerUserLimit(), HoldTTLMs: s.GetHoldTtlMs(),
		OpensAt: s.GetOpensAt().AsTime(), ServerTime: s.GetServerTime().AsTime(), Paused: s.GetPaused(),
		AdmitRate: s.GetAdmitRate(), TicketTTLMs: s.GetTicketTtlMs(), SKUs: []skuJSON{}}
	for _, k := range s.GetSkus() {
		out.SKUs = append(out.SKUs, skuJSON{SKU: k.GetSku(), SoldOut: k.GetSoldOut(), Paused: k.GetPaused(), Available: k.GetAvailable()})
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

var stateNames = map[quotav1.AdmissionState]string{
	quotav1.AdmissionState_ADMISSION_STATE_QUEUED: "queued", quotav1.AdmissionState_ADMISSION_STATE_ADMITTED: "admitted",
	quotav1.AdmissionState_ADMISSION_STATE_USED: "used", quotav1.AdmissionState_ADMISSION_STATE_EXPIRED: "expired",
	quotav1.AdmissionState_ADMISSION_STATE_CLOSED: "closed",
}

func toAdmissionJSON(a *quotav1.Admission) admissionJSON {
	out := admissionJSON{Admission: a.GetAdmissionId(), Sale: a.GetSaleId(), State: stateNames[a.GetState()], Position: a.GetPosition(),
		EstimatedWaitMs: a.GetEstimatedWaitMs(), RetryAfterMs: a.GetRetryAfterMs(), Ticket: a.GetTicket(), Region: a.GetRegion(),
		SKU: a.GetSku(), Reason: a.GetReason()}
	if a.GetExpiresAt() != nil {
		t := a.GetExpiresAt().AsTime()
		out.ExpiresAt = &t
	}
	return out
}

// writeAdmission answers an admission: 201 once admitted (a ticket), 202 while queued, with
// Retry-After saying when to poll; 200 for the rest.
func writeAdmission(w http.ResponseWriter, a *quotav1.Admission, created bool) {
	code := http.StatusOK
	switch a.GetState() {
	case quotav1.AdmissionState_ADMISSION_STATE_QUEUED:
		code = http.StatusAccepted
		w.Header().Set("Retry-After", strconv.FormatInt((a.GetRetryAfterMs()+999)/1000, 10))
	case quotav1.AdmissionState_ADMISSION_STATE_ADMITTED:
		if created {
			code = http.StatusCreated
		}
	}
	out := toAdmissionJSON(a)
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
	resp, err := h.s.Enter(r.Context(), &quotav1.EnterRequest{SaleId: r.PathValue("sale"), UserId: body.User, ClientAddress: clientAddress(r)})
	if err != nil {
		return err
	}
	writeAdmission(w, resp.GetAdmission(), true)
	return nil
}

func (h *handler) getAdmission(w http.ResponseWriter, r *http.Request) error {
	resp, err := h.s.GetAdmission(r.Context(), &quotav1.GetAdmissionRequest{SaleId: r.PathValue("sale"), AdmissionId: r.PathValue("admission")})
	if err != nil {
		return err
	}
	writeAdmission(w, resp.GetAdmission(), false)
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
	resp, err := h.s.JoinWaitlist(r.Context(), &quotav1.JoinWaitlistRequest{SaleId: r.PathValue("sale"), UserId: body.User, Sku: body.SKU})
	if err != nil {
		return err
	}
	writeAdmission(w, resp.GetAdmission(), true)
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
	Replayed   bool      `json:"replayed,omitempty"`
}

var holdStateNames = map[quotav1.HoldState]string{
	quotav1.HoldState_HOLD_STATE_HELD: "held", quotav1.HoldState_HOLD_STATE_SOLD: "sold",
	quotav1.HoldState_HOLD_STATE_RELEASED: "released", quotav1.HoldState_HOLD_STATE_EXPIRED: "expired",
}

func toHoldJSON(h *quotav1.Reservation) holdJSON {
	return holdJSON{Hold: h.GetHoldId(), Sale: h.GetSaleId(), SKU: h.GetSku(), User: h.GetUserId(), Quantity: h.GetQuantity(),
		RequestKey: h.GetRequestKey(), State: holdStateNames[h.GetState()], ExpiresAt: h.GetExpiresAt().AsTime(),
		PaymentID: h.GetPaymentId(), Region: h.GetRegion(), Admission: h.GetAdmissionId()}
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
	resp, err := h.s.ReserveToken(r.Context(), &quotav1.ReserveRequest{SaleId: r.PathValue("sale"), Sku: body.SKU, UserId: user,
		Quantity: body.Quantity, RequestKey: body.RequestKey, Ticket: body.Ticket}, tok)
	if err != nil {
		return err
	}
	out := toHoldJSON(resp.GetReservation())
	out.Replayed = resp.GetReplayed()
	code := http.StatusCreated
	if out.Replayed {
		code = http.StatusOK
	}
	rpcserve.WriteJSON(w, code, out)
	return nil
}

func (h *handler) getHold(w http.ResponseWriter, r *http.Request) error {
	resp, err := h.s.GetReservation(r.Context(), &quotav1.GetReservationRequest{HoldId: r.PathValue("hold")})
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, toHoldJSON(resp.GetReservation()))
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
	resp, err := h.s.Confirm(r.Context(), &quotav1.ConfirmRequest{HoldId: r.PathValue("hold"), PaymentId: body.PaymentID})
	if err != nil {
		return err
	}
	out := confirmJSON{Outcome: "refund", Reason: resp.GetReason(), Reservation: toHoldJSON(resp.GetReservation())}
	if resp.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD {
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
	resp, err := h.s.Release(r.Context(), &quotav1.ReleaseRequest{HoldId: r.PathValue("hold")})
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, toHoldJSON(resp.GetReservation()))
	return nil
}
