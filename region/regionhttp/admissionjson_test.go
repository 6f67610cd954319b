package regionhttp

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// sameAsMarshal fails unless marshalAdmission writes a as json.Marshal does, with a new line.
func sameAsMarshal(t *testing.T, a admissionJSON) {
	t.Helper()
	want, err := json.Marshal(a)
	if err != nil {
		return // no answer to compare: marshalAdmission panics as WriteJSON would
	}
	if got := marshalAdmission(&a); !bytes.Equal(got, append(want, '\n')) {
		t.Fatalf("%+v:\nmarshalAdmission %s\njson.Marshal     %s", a, got, want)
	}
}

// TestMarshalAdmissionIsMarshal checks marshalAdmission against json.Marshal on admissions of
// every state and on strings and times it leaves to json.Marshal, and that the common ones
// take the plain path.
func TestMarshalAdmissionIsMarshal(t *testing.T) {
	exp := time.Date(2026, 12, 2, 8, 0, 0, 123456000, time.UTC)
	whole := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	far := time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)
	zoned := exp.In(time.FixedZone("x", 3600))
	queued := admissionJSON{Admission: "q-1", Sale: "hb-poll", State: "queued", Position: 17, EstimatedWaitMs: 1700, RetryAfterMs: 1000}
	admitted := admissionJSON{Admission: "a-1", Sale: "s", State: "admitted", Ticket: "v1.AQ-_x.sig", ExpiresAt: &exp, Region: "us"}
	for _, a := range []admissionJSON{
		queued, admitted, {Admission: "w", Sale: "s", State: "admitted", SKU: "tee", ExpiresAt: &whole},
		{State: "closed", Reason: "SOLD_OUT"}, {}, {Position: -3},
		{Admission: "a<b>&c", Sale: `q"uote`, State: `back\slash`}, {Reason: "é"}, {Reason: "\x01"}, {Reason: "\xff"},
		{Reason: "\u2028"}, {ExpiresAt: &far}, {ExpiresAt: &zoned}, {ExpiresAt: &time.Time{}},
	} {
		sameAsMarshal(t, a)
	}
	for _, a := range []admissionJSON{queued, admitted} {
		if _, ok := appendAdmission(nil, &a); !ok {
			t.Errorf("%+v: not written by appendAdmission", a)
		}
	}
}

// FuzzMarshalAdmission checks marshalAdmission against json.Marshal on any admission.
func FuzzMarshalAdmission(f *testing.F) {
	f.Add("a-1", "s", "admitted", int64(0), int64(0), int64(0), "v1.x.y", int64(1764662400123), "us", "", "")
	f.Add("q-1", "s", "queued", int64(3), int64(3000), int64(1000), "", int64(0), "", "", "")
	f.Add("c", "s<", "closed", int64(-1), int64(0), int64(0), "", int64(-62135596800001), "", "tee", "é\"")
	f.Fuzz(func(t *testing.T, id, sale, state string, pos, wait, retry int64, ticket string, expMs int64, region, sku, reason string) {
		a := admissionJSON{Admission: id, Sale: sale, State: state, Position: pos, EstimatedWaitMs: wait, RetryAfterMs: retry,
			Ticket: ticket, Region: region, SKU: sku, Reason: reason}
		if expMs != 0 {
			exp := time.UnixMilli(expMs).UTC()
			a.ExpiresAt = &exp
		}
		sameAsMarshal(t, a)
	})
}

// TestMarshalAdmissionAllocs pins the cost of an admission poll's body: the one buffer it is
// written into, no reflection.
func TestMarshalAdmissionAllocs(t *testing.T) {
	exp := time.Date(2026, 12, 2, 8, 0, 0, 123456000, time.UTC)
	for _, a := range []admissionJSON{
		{Admission: "q-1", Sale: "hb-poll", State: "queued", Position: 17, EstimatedWaitMs: 1700, RetryAfterMs: 1000},
		{Admission: "a-1", Sale: "s", State: "admitted", Ticket: "v1.AQ-_x.sig", ExpiresAt: &exp, Region: "us"},
	} {
		if n := testing.AllocsPerRun(100, func() { marshalAdmission(&a) }); n > 1 {
			t.Errorf("%s: marshalAdmission allocates %v times; want 1", a.State, n)
		}
	}
}
