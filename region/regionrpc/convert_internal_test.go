package regionrpc

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/prototest"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// rounds is how many generated values each property test converts.
const rounds = 300

// declared is every string constant of type typ that the package in dir declares (its
// non-test files), read from the source: a state added there later is checked here too.
func declared(t *testing.T, dir, typ string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typ {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s: a %s constant that is not a string literal", fset.Position(v.Pos()), typ)
					}
					s, _ := strconv.Unquote(lit.Value)
					out = append(out, s)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no constant of type %s in %s", typ, dir)
	}
	return out
}

// TestHoldStatesMapOneToOne: every hold state the region declares has its own proto state,
// none UNSPECIFIED, and every proto state but UNSPECIFIED is one of them.
func TestHoldStatesMapOneToOne(t *testing.T) {
	seen := map[quotav1.HoldState]region.HoldState{}
	for _, s := range declared(t, "../", "HoldState") {
		pb, ok := holdStates[region.HoldState(s)]
		if !ok || pb == quotav1.HoldState_HOLD_STATE_UNSPECIFIED {
			t.Errorf("hold state %q has no proto state", s)
			continue
		}
		if other, dup := seen[pb]; dup {
			t.Errorf("hold states %q and %q both map to %s", other, s, pb)
		}
		seen[pb] = region.HoldState(s)
		if got := toProto(region.Hold{State: region.HoldState(s)}).State; got != pb {
			t.Errorf("toProto of a %q hold: %s, want %s", s, got, pb)
		}
		if want := "HOLD_STATE_" + strings.ToUpper(region.HoldState(s).String()); pb.String() != want {
			t.Errorf("hold state %q maps to %s, want %s: the enum names the state clients see", s, pb, want)
		}
		if back := HoldStateOf(pb); back != region.HoldState(s) {
			t.Errorf("HoldStateOf(%s) = %q, want %q", pb, back, s)
		}
	}
	for v := range quotav1.HoldState_name {
		if pb := quotav1.HoldState(v); pb != quotav1.HoldState_HOLD_STATE_UNSPECIFIED && seen[pb] == "" {
			t.Errorf("proto state %s is no region hold state's", pb)
		}
	}
	if s := HoldStateOf(quotav1.HoldState_HOLD_STATE_UNSPECIFIED); s != "" {
		t.Errorf("HoldStateOf(UNSPECIFIED) = %q, want none", s)
	}
}

// TestAdmissionStatesMap: every admission state a buyer can be told (region.Admission.Shown)
// has a proto state, with the name the state has (binding reads as queued, a buyer not yet
// told their ticket); elsewhere is never an admission but the error BOUND_ELSEWHERE
// (region.Door.answer); every proto state but UNSPECIFIED is some state's.
func TestAdmissionStatesMap(t *testing.T) {
	seen := map[quotav1.AdmissionState]bool{}
	for _, s := range declared(t, "../../admission", "EntryState") {
		st := admission.EntryState(s)
		if st == admission.Elsewhere {
			if pb, ok := admissionStates[st]; ok {
				t.Errorf("elsewhere maps to %s; it is answered as BOUND_ELSEWHERE", pb)
			}
			continue
		}
		shown := region.Admission{Entry: admission.Entry{State: st}}.Shown()
		pb := AdmissionToProto(region.Admission{Entry: admission.Entry{State: st}}).State
		if want := "ADMISSION_STATE_" + strings.ToUpper(string(shown)); pb.String() != want {
			t.Errorf("admission state %q (shown %q) answers %s over gRPC, want %s", s, shown, pb, want)
		}
		seen[pb] = true
	}
	if got := AdmissionToProto(region.Admission{Entry: admission.Entry{State: admission.Binding}}).State; got != quotav1.AdmissionState_ADMISSION_STATE_QUEUED {
		t.Errorf("binding answers %s, want QUEUED", got)
	}
	for v := range quotav1.AdmissionState_name {
		if pb := quotav1.AdmissionState(v); pb != quotav1.AdmissionState_ADMISSION_STATE_UNSPECIFIED && !seen[pb] {
			t.Errorf("proto state %s is no admission state's", pb)
		}
	}
}

type gen struct{ r *rand.Rand }

func newGen(seed uint64) gen { return gen{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))} }

func (g gen) id(prefix string) string { return fmt.Sprintf("%s-%d", prefix, g.r.IntN(1_000_000)) }

func (g gen) time() time.Time {
	sec := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() + g.r.Int64N(100*365*86400)
	return time.Unix(sec, 1+g.r.Int64N(999_999_999)).In(time.FixedZone("x", -7200))
}

func wantTime(t *testing.T, field string, got *timestamppb.Timestamp, want time.Time) {
	t.Helper()
	if err := got.CheckValid(); err != nil || !got.AsTime().Equal(want) {
		t.Errorf("%s = %v (%v), want %v", field, got, err, want)
	}
}

// TestHoldToProto: every field of a hold lands in its field of the reservation, for
// generated holds in every state.
func TestHoldToProto(t *testing.T) {
	g := newGen(1)
	states := []region.HoldState{region.Held, region.Sold, region.Released, region.Expired}
	for range rounds {
		h := region.Hold{ID: g.id("h"), Sale: g.id("sale"), SKU: g.id("sku"), User: g.id("u"), Quantity: transfer.Units(1 + g.r.Int64N(int64(transfer.MaxUnits))),
			RequestKey: g.id("k"), State: states[g.r.IntN(len(states))], ExpiresAt: g.time(), PaymentID: g.id("pay"), Region: g.id("r"), Admission: g.id("a"),
			CartID: g.id("c")}
		pb := toProto(h)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("toProto(%+v) left %v unset", h, unset)
		}
		if pb.HoldId != h.ID || pb.SaleId != h.Sale || pb.Sku != h.SKU || pb.UserId != h.User || pb.Quantity != int64(h.Quantity) ||
			pb.RequestKey != h.RequestKey || pb.State != holdStates[h.State] || pb.PaymentId != h.PaymentID || pb.Region != h.Region ||
			pb.AdmissionId != h.Admission || pb.CartId != h.CartID {
			t.Fatalf("toProto(%+v) = %v", h, pb)
		}
		wantTime(t, "expires_at", pb.ExpiresAt, h.ExpiresAt)
	}
}

// TestAdmissionToProto: every field of an admission lands in its field; an admission with
// no expiry (queued) has no expires_at rather than the year 1.
func TestAdmissionToProto(t *testing.T) {
	g := newGen(2)
	for range rounds {
		a := region.Admission{Entry: admission.Entry{ID: g.id("a"), User: g.id("u"), State: admission.Admitted, Position: 1 + g.r.IntN(1000),
			EstimatedWait: time.Duration(1+g.r.Int64N(1e6)) * time.Millisecond, ExpiresAt: g.time(), Region: g.id("r"), Reason: g.id("why")},
			Sale: g.id("sale"), Ticket: g.id("tk"), SKU: g.id("sku")}
		pb := AdmissionToProto(a)
		if unset := prototest.Unset(pb, "retry_after_ms"); len(unset) != 0 { // admitted: no retry
			t.Fatalf("AdmissionToProto(%+v) left %v unset", a, unset)
		}
		if pb.AdmissionId != a.ID || pb.SaleId != a.Sale || pb.UserId != a.User || pb.State != quotav1.AdmissionState_ADMISSION_STATE_ADMITTED ||
			pb.Position != int64(a.Position) || pb.EstimatedWaitMs != a.EstimatedWait.Milliseconds() || pb.RetryAfterMs != 0 ||
			pb.Ticket != a.Ticket || pb.Region != a.Region || pb.Reason != a.Reason || pb.Sku != a.SKU {
			t.Fatalf("AdmissionToProto(%+v) = %v", a, pb)
		}
		wantTime(t, "expires_at", pb.ExpiresAt, a.ExpiresAt)
	}
	if pb := AdmissionToProto(region.Admission{Entry: admission.Entry{State: admission.Queued}}); pb.ExpiresAt != nil {
		t.Errorf("a queued admission has expires_at %v", pb.ExpiresAt)
	}
}

// TestRetryAfter: a queued buyer polls again after a tenth of their wait, from 250 ms to
// 5 s; a buyer on a waitlist every 2 s; a buyer with an answer never.
func TestRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		state admission.EntryState
		wait  time.Duration
		sku   string
		want  int64
	}{
		{admission.Queued, 0, "", 250},
		{admission.Queued, time.Second, "", 250},
		{admission.Queued, 2500 * time.Millisecond, "", 250},
		{admission.Queued, 2510 * time.Millisecond, "", 251},
		{admission.Queued, 30 * time.Second, "", 3000},
		{admission.Queued, 50 * time.Second, "", 5000},
		{admission.Queued, time.Hour, "", 5000},
		{admission.Binding, time.Hour, "", 5000},
		{admission.Queued, time.Hour, "phone", 2000},
		{admission.Binding, 0, "phone", 2000},
		{admission.Admitted, time.Hour, "", 0},
		{admission.Used, 0, "", 0},
		{admission.Expired, 0, "", 0},
		{admission.Closed, time.Hour, "phone", 0},
	} {
		a := region.Admission{Entry: admission.Entry{State: tt.state, EstimatedWait: tt.wait}, SKU: tt.sku}
		if got := AdmissionToProto(a).RetryAfterMs; got != tt.want {
			t.Errorf("%s, wait %s, sku %q: retry_after_ms %d, want %d", tt.state, tt.wait, tt.sku, got, tt.want)
		}
	}
}

// termsProto is the PutSale terms a coordinator sends for t.
func termsProto(t region.SaleTerms) *quotav1.SaleTerms {
	return &quotav1.SaleTerms{SaleId: t.Sale, Skus: t.SKUs, PerUserLimit: int64(t.PerUserLimit), HoldTtlMs: t.HoldTTL.Milliseconds(),
		OpensAt: timestamppb.New(t.OpensAt), AdmitRate: t.Admission.Rate, TicketTtlMs: t.Admission.TicketTTL.Milliseconds(),
		MaxLiveTickets: t.Admission.MaxLive, RoomReturnUrl: t.Admission.ReturnURL}
}

// TestTermsRoundTrip: sale terms sent as PutSale's terms are the terms the region is given
// (domain → proto → domain), for generated terms.
func TestTermsRoundTrip(t *testing.T) {
	g := newGen(3)
	for range rounds {
		tm := region.SaleTerms{Sale: g.id("sale"), SKUs: []string{g.id("sku"), g.id("sku")}[:1+g.r.IntN(2)],
			PerUserLimit: transfer.Units(1 + g.r.Int64N(int64(transfer.MaxUnits))), HoldTTL: time.Duration(1+g.r.Int64N(86_400_000)) * time.Millisecond,
			OpensAt: g.time().UTC(), Admission: transfer.AdmissionTerms{Rate: 1 + g.r.Int64N(transfer.MaxAdmitRate),
				TicketTTL: time.Duration(1+g.r.Int64N(3_600_000)) * time.Millisecond, MaxLive: 1 + g.r.Int64N(transfer.MaxLiveTickets),
				ReturnURL: "https://" + g.id("shop") + ".example/"}}
		got, err := termsFromProto(termsProto(tm))
		if err != nil || !reflect.DeepEqual(got, tm) {
			t.Fatalf("termsFromProto(termsProto(%+v)) = %+v, %v", tm, got, err)
		}
	}
}

func fieldOf(err error) string {
	var inv *apierr.InvalidError
	if errors.As(err, &inv) {
		return inv.Field
	}
	return ""
}

// wrapsTo60s is a count of milliseconds no duration holds which, multiplied into
// nanoseconds, wraps around to exactly 60 s: 2^58 ms is 15,625 × 2^64 ns.
const wrapsTo60s = 1<<58 + 60_000

// TestTermsRefuseWhatTheyCannotCarry: terms missing, without a valid opens_at, or with a TTL
// no duration holds are refused naming the field (without the check, hold_ttl_ms
// 2^58+60,000 became a 60 s hold).
func TestTermsRefuseWhatTheyCannotCarry(t *testing.T) {
	ok := func() *quotav1.SaleTerms {
		return &quotav1.SaleTerms{SaleId: "s", Skus: []string{"k"}, PerUserLimit: 1, HoldTtlMs: 60_000, OpensAt: timestamppb.Now()}
	}
	if _, err := termsFromProto(ok()); err != nil {
		t.Fatalf("good terms: %v", err)
	}
	if _, err := termsFromProto(nil); fieldOf(err) != "sale" {
		t.Errorf("no terms: %v; want INVALID_ARGUMENT on sale", err)
	}
	for _, tt := range []struct {
		name  string
		edit  func(*quotav1.SaleTerms)
		field string
	}{
		{"no opens_at", func(s *quotav1.SaleTerms) { s.OpensAt = nil }, "opens_at"},
		{"opens_at nanos", func(s *quotav1.SaleTerms) { s.OpensAt = &timestamppb.Timestamp{Nanos: 1e9} }, "opens_at"},
		{"opens_at before year 1", func(s *quotav1.SaleTerms) { s.OpensAt = &timestamppb.Timestamp{Seconds: -62135596801} }, "opens_at"},
		{"hold_ttl_ms wraps", func(s *quotav1.SaleTerms) { s.HoldTtlMs = wrapsTo60s }, "hold_ttl"},
		{"hold_ttl_ms min", func(s *quotav1.SaleTerms) { s.HoldTtlMs = math.MinInt64 }, "hold_ttl"},
		{"ticket_ttl_ms wraps", func(s *quotav1.SaleTerms) { s.AdmitRate, s.TicketTtlMs = 10, wrapsTo60s }, "ticket_ttl"},
		{"ticket_ttl_ms max", func(s *quotav1.SaleTerms) { s.TicketTtlMs = math.MaxInt64 }, "ticket_ttl"},
	} {
		s := ok()
		tt.edit(s)
		if _, err := termsFromProto(s); fieldOf(err) != tt.field {
			t.Errorf("%s: %v; want INVALID_ARGUMENT on %s", tt.name, err, tt.field)
		}
	}
}
