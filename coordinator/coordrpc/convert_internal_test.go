package coordrpc

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/prototest"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// rounds is how many generated values each property test converts.
const rounds = 300

// gen makes domain values with every field set (non-zero, bools true), so a field a
// conversion forgets shows up as unset in the message (prototest.Unset).
type gen struct{ r *rand.Rand }

func newGen(seed uint64) gen { return gen{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))} }

func (g gen) id(prefix string) string { return fmt.Sprintf("%s-%d", prefix, g.r.IntN(1_000_000)) }
func (g gen) units() transfer.Units   { return transfer.Units(1 + g.r.Int64N(int64(transfer.MaxUnits))) }
func (g gen) n(max int) int           { return 1 + g.r.IntN(max) }

// time is a moment between 2000 and 2100 with nanoseconds, in a zone other than UTC.
func (g gen) time() time.Time {
	sec := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() + g.r.Int64N(100*365*86400)
	return time.Unix(sec, 1+g.r.Int64N(999_999_999)).In(time.FixedZone("x", 3600))
}

// ms is a whole positive number of milliseconds, as the ledger stores durations.
func (g gen) ms(max time.Duration) time.Duration {
	return time.Duration(1+g.r.Int64N(max.Milliseconds())) * time.Millisecond
}

func (g gen) pause() coordinator.Pause {
	return coordinator.Pause{Sale: g.id("sale"), SKU: g.id("sku"), Paused: true, Reason: g.id("why"), ChangedAt: g.time(),
		Version: coordinator.PauseVersion(g.n(1 << 30)), Undelivered: []string{g.id("r"), g.id("r")}[:g.n(2)]}
}

func (g gen) sale() coordinator.Sale {
	s := coordinator.Sale{Terms: coordinator.SaleTerms{Sale: g.id("sale"), PerUserLimit: g.units(), HoldTTL: g.ms(24 * time.Hour),
		OpensAt: g.time(), Admission: transfer.AdmissionTerms{Rate: int64(g.n(transfer.MaxAdmitRate)), TicketTTL: g.ms(time.Hour),
			MaxLive: int64(g.n(transfer.MaxLiveTickets)), ReturnURL: "https://" + g.id("shop") + ".example/back"}},
		CreatedAt: g.time(), Rebalance: []coordinator.RebalanceMode{coordinator.RebalanceAuto, coordinator.RebalanceManual}[g.r.IntN(2)]}
	for range g.n(4) {
		k := coordinator.SKULedger{SKU: g.id("sku"), Total: g.units(), Unallocated: g.units(), Allocated: map[string]transfer.Units{}}
		for range g.n(3) {
			k.Allocated[g.id("r")] = g.units()
		}
		s.SKUs = append(s.SKUs, k)
	}
	for range g.n(3) {
		s.Pauses = append(s.Pauses, g.pause())
	}
	return s
}

func (g gen) transfer() transfer.Transfer {
	states := []transfer.State{transfer.Requested, transfer.Pending, transfer.Posted, transfer.Voided}
	return transfer.Transfer{CreatedAt: g.time(), ID: g.id("t"), Sale: g.id("sale"), SKU: g.id("sku"), From: g.id("r"), To: g.id("r"),
		Units: g.units(), State: states[g.r.IntN(len(states))], Generation: int64(g.n(1 << 40)), Stranded: true, Reason: g.id("why"), Settled: true}
}

func wantTime(t *testing.T, field string, got *timestamppb.Timestamp, want time.Time) {
	t.Helper()
	if err := got.CheckValid(); err != nil || !got.AsTime().Equal(want) {
		t.Errorf("%s = %v (%v), want %v", field, got, err, want)
	}
}

// TestSaleToProto: every field of a sale, its SKUs' ledgers and its pauses lands in its
// field of the message, for generated sales.
func TestSaleToProto(t *testing.T) {
	g := newGen(1)
	for range rounds {
		s := g.sale()
		pb := saleToProto(s)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("saleToProto(%+v) left %v unset", s, unset)
		}
		tm := s.Terms
		if pb.SaleId != tm.Sale || pb.PerUserLimit != int64(tm.PerUserLimit) || pb.HoldTtlMs != tm.HoldTTL.Milliseconds() ||
			pb.AdmitRate != tm.Admission.Rate || pb.TicketTtlMs != tm.Admission.TicketTTL.Milliseconds() ||
			pb.MaxLiveTickets != tm.Admission.MaxLive || pb.Rebalance != string(s.Rebalance) || pb.RoomReturnUrl != tm.Admission.ReturnURL {
			t.Fatalf("saleToProto(%+v) = %v", s, pb)
		}
		wantTime(t, "opens_at", pb.OpensAt, tm.OpensAt)
		wantTime(t, "created_at", pb.CreatedAt, s.CreatedAt)
		if len(pb.Skus) != len(s.SKUs) || len(pb.Pauses) != len(s.Pauses) {
			t.Fatalf("saleToProto: %d skus, %d pauses; want %d, %d", len(pb.Skus), len(pb.Pauses), len(s.SKUs), len(s.Pauses))
		}
		for i, k := range s.SKUs {
			pk := pb.Skus[i]
			if pk.Sku != k.SKU || pk.Total != int64(k.Total) || pk.Unallocated != int64(k.Unallocated) || len(pk.Allocated) != len(k.Allocated) {
				t.Fatalf("sku %d: %v, want %+v", i, pk, k)
			}
			for r, u := range k.Allocated {
				if got, ok := pk.Allocated[r]; !ok || got != int64(u) {
					t.Fatalf("sku %d allocated[%s] = %d, %v; want %d", i, r, got, ok, u)
				}
			}
		}
		for i, p := range s.Pauses {
			checkPause(t, pb.Pauses[i], p)
		}
	}
}

func checkPause(t *testing.T, pb *quotav1.Pause, p coordinator.Pause) {
	t.Helper()
	if pb.SaleId != p.Sale || pb.Sku != p.SKU || pb.Paused != p.Paused || pb.Reason != p.Reason || pb.Version != int64(p.Version) ||
		!slices.Equal(pb.Undelivered, p.Undelivered) {
		t.Fatalf("pause %v, want %+v", pb, p)
	}
	wantTime(t, "changed_at", pb.ChangedAt, p.ChangedAt)
}

// TestPauseToProto: a pause and a resume (paused false, no regions left) keep every field.
func TestPauseToProto(t *testing.T) {
	g := newGen(2)
	for range rounds {
		p := g.pause()
		pb := PauseToProto(p)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("PauseToProto(%+v) left %v unset", p, unset)
		}
		checkPause(t, pb, p)
		p.Paused, p.Undelivered = false, nil
		checkPause(t, PauseToProto(p), p)
	}
}

// TestFailuresToProto: each region a pause did not reach, in order, with its error; none
// is an empty list.
func TestFailuresToProto(t *testing.T) {
	fs := []coordinator.RegionFailure{{Region: "us", Error: "unavailable"}, {Region: "eu", Error: "deadline exceeded"}}
	got := failuresToProto(fs)
	if len(got) != 2 || got[0].Region != "us" || got[0].Error != "unavailable" || got[1].Region != "eu" || got[1].Error != "deadline exceeded" {
		t.Errorf("failuresToProto(%v) = %v", fs, got)
	}
	if got := failuresToProto(nil); len(got) != 0 {
		t.Errorf("failuresToProto(nil) = %v", got)
	}
}

// TestTransferToProto: every field of a transfer the message has lands in it; settled has
// no field (the state says it).
func TestTransferToProto(t *testing.T) {
	g := newGen(3)
	for range rounds {
		tr := g.transfer()
		pb := TransferToProto(tr)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("TransferToProto(%+v) left %v unset", tr, unset)
		}
		if pb.TransferId != tr.ID || pb.SaleId != tr.Sale || pb.Sku != tr.SKU || pb.From != tr.From || pb.To != tr.To ||
			pb.Units != int64(tr.Units) || pb.State != string(tr.State) || pb.Generation != tr.Generation ||
			pb.Stranded != tr.Stranded || pb.Reason != tr.Reason {
			t.Fatalf("TransferToProto(%+v) = %v", tr, pb)
		}
		wantTime(t, "created_at", pb.CreatedAt, tr.CreatedAt)
	}
}

func (g gen) report() coordinator.Report {
	rep := coordinator.Report{OK: true, At: g.time()}
	for range g.n(3) {
		a := coordinator.SKUAudit{Sale: g.id("sale"), SKU: g.id("sku"), Total: g.units(), Unallocated: g.units(), Available: g.units(),
			Held: g.units(), Sold: g.units(), InFlight: g.units(), Stranded: g.units(), OK: true}
		for range g.n(3) {
			a.Regions = append(a.Regions, coordinator.RegionAudit{Region: g.id("r"), Available: g.units(), Held: g.units(), Sold: g.units(),
				CreditedIn: g.units(), DebitedOut: g.units(), Reachable: true, Error: g.id("err")})
		}
		rep.SKUs = append(rep.SKUs, a)
	}
	for range g.n(3) {
		rep.Violations = append(rep.Violations, coordinator.Violation{Invariant: "I" + g.id("1"), Sale: g.id("sale"), SKU: g.id("sku"),
			Region: g.id("r"), Detail: g.id("d")})
	}
	for range g.n(2) {
		rep.Pauses = append(rep.Pauses, g.pause())
	}
	return rep
}

// TestAuditToProto: every count of every SKU and region, every violation and pause of an
// audit report lands in its field, in order.
func TestAuditToProto(t *testing.T) {
	g := newGen(4)
	for range rounds {
		rep := g.report()
		pb := auditToProto(rep)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("auditToProto left %v unset", unset)
		}
		wantTime(t, "at", pb.At, rep.At)
		if pb.Ok != rep.OK || len(pb.Skus) != len(rep.SKUs) || len(pb.Violations) != len(rep.Violations) || len(pb.Pauses) != len(rep.Pauses) {
			t.Fatalf("auditToProto(%+v) = %v", rep, pb)
		}
		for i, a := range rep.SKUs {
			got := pb.Skus[i]
			want := []int64{int64(a.Total), int64(a.Unallocated), int64(a.Available), int64(a.Held), int64(a.Sold), int64(a.InFlight), int64(a.Stranded)}
			if have := []int64{got.Total, got.Unallocated, got.Available, got.Held, got.Sold, got.InFlight, got.Stranded}; !slices.Equal(have, want) ||
				got.SaleId != a.Sale || got.Sku != a.SKU || got.Ok != a.OK || len(got.Regions) != len(a.Regions) {
				t.Fatalf("sku audit %v, want %+v", got, a)
			}
			for j, r := range a.Regions {
				gr := got.Regions[j]
				if gr.Region != r.Region || gr.Available != int64(r.Available) || gr.Held != int64(r.Held) || gr.Sold != int64(r.Sold) ||
					gr.CreditedIn != int64(r.CreditedIn) || gr.DebitedOut != int64(r.DebitedOut) || gr.Reachable != r.Reachable || gr.Error != r.Error {
					t.Fatalf("region audit %v, want %+v", gr, r)
				}
			}
		}
		for i, v := range rep.Violations {
			gv := pb.Violations[i]
			if gv.Invariant != v.Invariant || gv.SaleId != v.Sale || gv.Sku != v.SKU || gv.Region != v.Region || gv.Detail != v.Detail {
				t.Fatalf("violation %v, want %+v", gv, v)
			}
		}
		for i, p := range rep.Pauses {
			checkPause(t, pb.Pauses[i], p)
		}
	}
}

func (g gen) policy() transfer.Policy {
	return transfer.Policy{Window: g.ms(time.Hour), Horizon: g.ms(time.Hour), MinUnits: g.units()}
}

func (g gen) moves() []transfer.Move {
	var ms []transfer.Move
	for range g.n(3) {
		ms = append(ms, transfer.Move{From: g.id("r"), To: g.id("r"), Units: g.units()})
	}
	return ms
}

func checkMoves(t *testing.T, got []*quotav1.PlannedMove, want []transfer.Move) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d moves, want %d", len(got), len(want))
	}
	for i, m := range want {
		if got[i].From != m.From || got[i].To != m.To || got[i].Units != int64(m.Units) {
			t.Fatalf("move %v, want %+v", got[i], m)
		}
	}
}

// TestPlanToProto: the plan's pools, moves and reasons, and the policy it was made under;
// a pool that never runs out (a negative EmptyIn) is -1 ms, one that does its time in ms.
func TestPlanToProto(t *testing.T) {
	g := newGen(5)
	for range rounds {
		p := g.policy()
		plan := coordinator.SalePlan{Sale: g.id("sale"), Mode: coordinator.RebalanceManual, Enabled: true, At: g.time()}
		for range g.n(3) {
			k := coordinator.SKUPlan{SKU: g.id("sku"), NearSellOut: true, InFlight: g.n(5), Moves: g.moves(), Held: g.id("why")}
			for range g.n(3) {
				d := transfer.PoolPlan{PoolDemand: transfer.PoolDemand{Pool: g.id("r"), Available: g.units(), Recent: g.units(),
					Incoming: g.units(), Frozen: true}, Need: g.units(), Projection: transfer.Projection{PerSecond: 0.5 + g.r.Float64(), EmptyIn: g.ms(time.Hour)}}
				k.Pools = append(k.Pools, d)
			}
			plan.SKUs = append(plan.SKUs, k)
		}
		pb := planToProto(plan, p)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("planToProto left %v unset", unset)
		}
		if pb.SaleId != plan.Sale || pb.Mode != string(plan.Mode) || pb.Enabled != plan.Enabled || pb.WindowMs != p.Window.Milliseconds() ||
			pb.HorizonMs != p.Horizon.Milliseconds() || pb.MinUnits != int64(p.MinUnits) || len(pb.Skus) != len(plan.SKUs) {
			t.Fatalf("planToProto(%+v) = %v", plan, pb)
		}
		wantTime(t, "at", pb.At, plan.At)
		for i, k := range plan.SKUs {
			sp := pb.Skus[i]
			if sp.Sku != k.SKU || sp.NearSellOut != k.NearSellOut || sp.InFlight != int64(k.InFlight) || sp.Held != k.Held || len(sp.Pools) != len(k.Pools) {
				t.Fatalf("sku plan %v, want %+v", sp, k)
			}
			checkMoves(t, sp.Moves, k.Moves)
			for j, d := range k.Pools {
				pp := sp.Pools[j]
				if pp.Pool != d.Pool || pp.Available != int64(d.Available) || pp.Recent != int64(d.Recent) || pp.Incoming != int64(d.Incoming) ||
					pp.Need != int64(d.Need) || pp.Frozen != d.Frozen || pp.PerSecond != d.Projection.PerSecond || pp.EmptyInMs != d.Projection.EmptyIn.Milliseconds() {
					t.Fatalf("pool plan %v, want %+v", pp, d)
				}
			}
		}
	}
	for _, tt := range []struct {
		in   time.Duration
		want int64
	}{{-1, -1}, {-time.Hour, -1}, {0, 0}, {999 * time.Microsecond, 0}, {1500 * time.Millisecond, 1500}} {
		plan := coordinator.SalePlan{SKUs: []coordinator.SKUPlan{{Pools: []transfer.PoolPlan{{Projection: transfer.Projection{EmptyIn: tt.in}}}}}}
		if got := planToProto(plan, transfer.Policy{}).Skus[0].Pools[0].EmptyInMs; got != tt.want {
			t.Errorf("EmptyIn %s: empty_in_ms %d, want %d", tt.in, got, tt.want)
		}
	}
}

// TestRebalanceToProto: each pool with its need under the request's policy, the moves and
// the transfers started, and whether they were replayed.
func TestRebalanceToProto(t *testing.T) {
	g := newGen(6)
	for range rounds {
		p := g.policy()
		res := coordinator.RebalanceResult{Moves: g.moves(), Replayed: true}
		for range g.n(3) {
			res.Pools = append(res.Pools, transfer.PoolDemand{Pool: g.id("r"), Available: g.units(), Recent: g.units()})
			res.Transfers = append(res.Transfers, g.transfer())
		}
		pb := rebalanceToProto(res, p)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("rebalanceToProto left %v unset", unset)
		}
		if !pb.Replayed || len(pb.Pools) != len(res.Pools) || len(pb.Transfers) != len(res.Transfers) {
			t.Fatalf("rebalanceToProto(%+v) = %v", res, pb)
		}
		for i, d := range res.Pools {
			pd := pb.Pools[i]
			if pd.Pool != d.Pool || pd.Available != int64(d.Available) || pd.Recent != int64(d.Recent) || pd.Need != int64(p.Need(d)) {
				t.Fatalf("pool %v, want %+v with need %d", pd, d, p.Need(d))
			}
		}
		checkMoves(t, pb.Moves, res.Moves)
		for i, tr := range res.Transfers {
			if pb.Transfers[i].TransferId != tr.ID {
				t.Fatalf("transfer %d is %s, want %s", i, pb.Transfers[i].TransferId, tr.ID)
			}
		}
	}
}

// specRequest is the CreateSale request a client sends for spec.
func specRequest(spec coordinator.SaleSpec) *quotav1.CreateSaleRequest {
	req := &quotav1.CreateSaleRequest{SaleId: spec.Sale, PerUserLimit: int64(spec.PerUserLimit), HoldTtlMs: spec.HoldTTL.Milliseconds(),
		AdmitRate: spec.Admission.Rate, TicketTtlMs: spec.Admission.TicketTTL.Milliseconds(), MaxLiveTickets: spec.Admission.MaxLive,
		Rebalance: string(spec.Rebalance), RoomReturnUrl: spec.Admission.ReturnURL}
	if !spec.OpensAt.IsZero() {
		req.OpensAt = timestamppb.New(spec.OpensAt)
	}
	for _, k := range spec.SKUs {
		req.Skus = append(req.Skus, &quotav1.SkuTotal{Sku: k.SKU, Total: int64(k.Total)})
	}
	return req
}

// TestSaleSpecRoundTrip: a sale spec sent as a CreateSale request is the spec the
// coordinator is given (domain → proto → domain), for generated specs; an unset opens_at
// is the zero time (open at once).
func TestSaleSpecRoundTrip(t *testing.T) {
	g := newGen(7)
	for i := range rounds {
		s := g.sale()
		spec := coordinator.SaleSpec{Sale: s.Terms.Sale, PerUserLimit: s.Terms.PerUserLimit, HoldTTL: s.Terms.HoldTTL,
			OpensAt: s.Terms.OpensAt.UTC(), Admission: s.Terms.Admission, Rebalance: s.Rebalance}
		if i%5 == 0 {
			spec.OpensAt = time.Time{}
		}
		for _, k := range s.SKUs {
			spec.SKUs = append(spec.SKUs, coordinator.SKUTotal{SKU: k.SKU, Total: k.Total})
		}
		got, err := saleSpecFromProto(specRequest(spec))
		if err != nil || !reflect.DeepEqual(got, spec) {
			t.Fatalf("saleSpecFromProto(specRequest(%+v)) = %+v, %v", spec, got, err)
		}
	}
}

// TestTermsToProto: every term a region is sent lands in its field of PutSale's terms.
func TestTermsToProto(t *testing.T) {
	g := newGen(8)
	for range rounds {
		tm := g.sale().Terms
		tm.SKUs = []string{g.id("sku"), g.id("sku")}
		pb := termsToProto(tm)
		if unset := prototest.Unset(pb); len(unset) != 0 {
			t.Fatalf("termsToProto(%+v) left %v unset", tm, unset)
		}
		if pb.SaleId != tm.Sale || !slices.Equal(pb.Skus, tm.SKUs) || pb.PerUserLimit != int64(tm.PerUserLimit) ||
			pb.HoldTtlMs != tm.HoldTTL.Milliseconds() || pb.AdmitRate != tm.Admission.Rate ||
			pb.TicketTtlMs != tm.Admission.TicketTTL.Milliseconds() || pb.MaxLiveTickets != tm.Admission.MaxLive ||
			pb.RoomReturnUrl != tm.Admission.ReturnURL {
			t.Fatalf("termsToProto(%+v) = %v", tm, pb)
		}
		wantTime(t, "opens_at", pb.OpensAt, tm.OpensAt)
	}
}

// fieldOf is the field an INVALID_ARGUMENT error names, or "".
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

// TestRequestsRefuseWhatTheyCannotCarry: a CreateSale or Rebalance request whose times no
// duration holds, or whose opens_at is no valid timestamp, is refused naming the field
// (without the check, hold_ttl_ms 2^58+60,000 became a 60 s hold).
func TestRequestsRefuseWhatTheyCannotCarry(t *testing.T) {
	ok := func() *quotav1.CreateSaleRequest {
		return &quotav1.CreateSaleRequest{SaleId: "s", PerUserLimit: 1, HoldTtlMs: 60_000, Skus: []*quotav1.SkuTotal{{Sku: "k", Total: 1}}}
	}
	if _, err := saleSpecFromProto(ok()); err != nil {
		t.Fatalf("a good request: %v", err)
	}
	for _, tt := range []struct {
		name  string
		edit  func(*quotav1.CreateSaleRequest)
		field string
	}{
		{"hold_ttl_ms wraps", func(r *quotav1.CreateSaleRequest) { r.HoldTtlMs = wrapsTo60s }, "hold_ttl"},
		{"hold_ttl_ms max", func(r *quotav1.CreateSaleRequest) { r.HoldTtlMs = math.MaxInt64 }, "hold_ttl"},
		{"ticket_ttl_ms wraps", func(r *quotav1.CreateSaleRequest) { r.AdmitRate, r.TicketTtlMs = 10, wrapsTo60s }, "ticket_ttl"},
		{"ticket_ttl_ms min", func(r *quotav1.CreateSaleRequest) { r.TicketTtlMs = math.MinInt64 }, "ticket_ttl"},
		{"opens_at nanos", func(r *quotav1.CreateSaleRequest) { r.OpensAt = &timestamppb.Timestamp{Seconds: 1, Nanos: -1} }, "opens_at"},
		{"opens_at year 10000", func(r *quotav1.CreateSaleRequest) { r.OpensAt = &timestamppb.Timestamp{Seconds: 253402300800} }, "opens_at"},
	} {
		r := ok()
		tt.edit(r)
		if _, err := saleSpecFromProto(r); fieldOf(err) != tt.field {
			t.Errorf("%s: %v; want INVALID_ARGUMENT on %s", tt.name, err, tt.field)
		}
	}
	for _, r := range []*quotav1.RebalanceRequest{{WindowMs: wrapsTo60s, HorizonMs: 1000}, {WindowMs: 1000, HorizonMs: wrapsTo60s}, {WindowMs: math.MinInt64}} {
		if _, err := policyFromProto(r); fieldOf(err) != "policy" {
			t.Errorf("policyFromProto(%v): %v; want INVALID_ARGUMENT on policy", r, err)
		}
	}
	p, err := policyFromProto(&quotav1.RebalanceRequest{WindowMs: 3000, HorizonMs: 10_000, MinUnits: 5})
	if err != nil || p != (transfer.Policy{Window: 3 * time.Second, Horizon: 10 * time.Second, MinUnits: 5}) {
		t.Errorf("policyFromProto: %+v, %v", p, err)
	}
}
