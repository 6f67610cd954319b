package regionhttp

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// zone is a time zone other than UTC: the region's times may carry one, the edge answers UTC.
var zone = time.FixedZone("x", 3600)

func marshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHoldJSON: a region's hold is answered with every field in its place, its state by the
// name clients see (the region's one table of them) and its expiry in UTC, byte for byte as
// docs/openapi.yaml's Reservation.
func TestHoldJSON(t *testing.T) {
	exp := time.Date(2026, 12, 2, 9, 0, 0, 123456000, zone)
	for _, st := range []region.HoldState{region.Held, region.Sold, region.Released, region.Expired} {
		h := region.Hold{ID: "us.1", Region: "us", Sale: "s", SKU: "tee", User: "alice", Quantity: 2, RequestKey: "k1",
			State: st, CreatedAt: exp, ExpiresAt: exp, PaymentID: "pay-1", Admission: "a-1", CartID: "us.0"}
		want := `{"hold_id":"us.1","sale_id":"s","sku":"tee","user_id":"alice","quantity":2,"request_key":"k1","state":"` +
			string(st) + `","expires_at":"2026-12-02T08:00:00.123456Z","payment_id":"pay-1","region":"us","admission_id":"a-1","cart_id":"us.0"}`
		if got := marshal(t, toHoldJSON(h)); got != want {
			t.Errorf("a %s hold:\n got %s\nwant %s", st, got, want)
		}
	}
	if got, want := marshal(t, toHoldJSON(region.Hold{State: region.Held})), `{"hold_id":"","sale_id":"","sku":"","user_id":"",`+
		`"quantity":0,"request_key":"","state":"held","expires_at":"0001-01-01T00:00:00Z","region":""}`; got != want {
		t.Errorf("an empty hold:\n got %s\nwant %s", got, want)
	}
}

// TestAdmissionJSON: an admission is answered as the buyer is told it: binding reads as
// queued with when to poll, an expiry in UTC, none while queued.
func TestAdmissionJSON(t *testing.T) {
	exp := time.Date(2026, 12, 2, 9, 0, 0, 0, zone)
	for _, tc := range []struct {
		a    region.Admission
		want string
	}{
		{region.Admission{Entry: admission.Entry{ID: "q", State: admission.Binding, Position: 3, EstimatedWait: 30 * time.Second}, Sale: "s"},
			`{"admission_id":"q","sale_id":"s","state":"queued","position":3,"estimated_wait_ms":30000,"retry_after_ms":3000}`},
		{region.Admission{Entry: admission.Entry{ID: "a", State: admission.Admitted, ExpiresAt: exp, Region: "us"}, Sale: "s", Ticket: "v1.t"},
			`{"admission_id":"a","sale_id":"s","state":"admitted","ticket":"v1.t","expires_at":"2026-12-02T08:00:00Z","region":"us"}`},
		{region.Admission{Entry: admission.Entry{ID: "w", State: admission.Queued}, Sale: "s", SKU: "tee"},
			`{"admission_id":"w","sale_id":"s","state":"queued","retry_after_ms":2000,"sku":"tee"}`},
		{region.Admission{Entry: admission.Entry{ID: "c", State: admission.Closed, Reason: "SOLD_OUT"}, Sale: "s"},
			`{"admission_id":"c","sale_id":"s","state":"closed","reason":"SOLD_OUT"}`},
	} {
		out := toAdmissionJSON(tc.a)
		if got := string(marshalAdmission(&out)); got != tc.want+"\n" {
			t.Errorf("%+v:\n got %s\nwant %s", tc.a, got, tc.want)
		}
	}
}

// TestSaleJSON: a sale's view is answered with its terms in milliseconds, its times in UTC
// and its SKUs a list, empty rather than null.
func TestSaleJSON(t *testing.T) {
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, zone)
	v := region.SaleView{Terms: region.SaleTerms{Sale: "s", PerUserLimit: 2, HoldTTL: time.Minute, OpensAt: at,
		Admission: transfer.AdmissionTerms{Rate: 10, TicketTTL: 5 * time.Minute}}, Region: "us", ServerTime: at.Add(time.Second)}
	want := `{"sale_id":"s","region":"us","per_user_limit":2,"hold_ttl_ms":60000,"opens_at":"2026-12-02T08:00:00Z",` +
		`"server_time":"2026-12-02T08:00:01Z","paused":false,"admit_rate":10,"ticket_ttl_ms":300000,"skus":[]}`
	if got := marshal(t, toSaleJSON(v)); got != want {
		t.Errorf("a sale without SKUs:\n got %s\nwant %s", got, want)
	}
	v.SKUs = []region.SKUView{{SKU: "tee", SoldOut: true, Paused: true, Available: 7}}
	if got := marshal(t, toSaleJSON(v).SKUs); got != `[{"sku":"tee","sold_out":true,"paused":true,"available":7}]` {
		t.Errorf("its SKUs: %s", got)
	}
}
