package regionrpc_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/testpg"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/region/regionrpc"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var quiet = slog.New(slog.DiscardHandler)

// leaderAt is the address the standby names as its region's leader.
const leaderAt = "127.0.0.1:7"

// fixture is a region "us" leading on its own database, served with its front door over
// loopback as quotad serves it (rpcserve, the region guard), and a standby of it (same
// database, not leading, no front door), served too.
type fixture struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	r       *region.Region
	keys    *admission.Keyring
	store   quotav1.RegionServiceClient
	part    quotav1.ParticipantServiceClient
	conn    *grpc.ClientConn
	standby quotav1.RegionServiceClient
}

// serve starts rs over loopback as region name's gRPC server and returns a client of it.
func serve(t *testing.T, name string, rs *regionrpc.Server) *grpc.ClientConn {
	t.Helper()
	srv, err := rpcserve.Listen("127.0.0.1:0", rpcserve.Options{Logger: quiet,
		Guards: []grpc.UnaryServerInterceptor{rpcserve.AddressedTo(name)}})
	if err != nil {
		t.Fatal(err)
	}
	quotav1.RegisterRegionServiceServer(srv.GRPC, rs)
	quotav1.RegisterParticipantServiceServer(srv.GRPC, rs)
	srv.Start()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{ctx: context.Background()}
	f.pool, _ = testpg.NewPool(t, "regionrpc", 8)
	if err := region.Migrate(f.ctx, f.pool); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.keys, err = admission.ParseKeyring([]byte("k1 " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) + "\n")); err != nil {
		t.Fatal(err)
	}
	cfg := region.Config{Name: "us", Logger: quiet, Sweep: region.SweepConfig{Interval: time.Hour}, MaxKeysPerUser: 3,
		Cluster: region.ClusterView{Tickets: func() *admission.Keyring { return f.keys }, SoldOut: func(_, sku string) bool { return sku == "gone" }}}
	if f.r, err = region.New(cfg, f.pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.r.Close)
	if err := f.r.Lead(f.ctx, 1); err != nil {
		t.Fatal(err)
	}
	door, err := region.NewDoor(f.r, region.DoorConfig{Keys: cfg.Cluster.Tickets, PerUserRate: 1, PerUserBurst: 1,
		Bind: func(_ context.Context, _, user, here string) (string, error) {
			if user == "bound" {
				return "eu", nil // bound at eu first
			}
			return here, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(door.Close)
	f.conn = serve(t, "us", &regionrpc.Server{R: f.r, D: door})
	f.store, f.part = quotav1.NewRegionServiceClient(f.conn), quotav1.NewParticipantServiceClient(f.conn)
	cfg.Cluster.LeaderHint = func() string { return leaderAt }
	standby, err := region.New(cfg, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Close)
	f.standby = quotav1.NewRegionServiceClient(serve(t, "us", &regionrpc.Server{R: standby}))
	return f
}

// sale records terms (generation 1) and credits units of each SKU.
func (f *fixture) sale(t *testing.T, terms *quotav1.SaleTerms, units int64) {
	t.Helper()
	if _, err := f.part.PutSale(f.ctx, &quotav1.PutSaleRequest{Generation: 1, Sale: terms}); err != nil {
		t.Fatalf("put sale %s: %v", terms.SaleId, err)
	}
	for _, sku := range terms.Skus {
		_, err := f.part.Credit(f.ctx, &quotav1.CreditRequest{Generation: 1, TransferId: "in-" + terms.SaleId + "-" + sku,
			SaleId: terms.SaleId, Sku: sku, Units: units})
		if err != nil {
			t.Fatalf("credit %s/%s: %v", terms.SaleId, sku, err)
		}
	}
}

func terms(sale string, limit int64, skus ...string) *quotav1.SaleTerms {
	return &quotav1.SaleTerms{SaleId: sale, Skus: skus, PerUserLimit: limit, HoldTtlMs: 600_000,
		OpensAt: timestamppb.New(time.Now().Add(-time.Hour))}
}

// detail is the one detail of type D an error carries, or nil.
func detail[D any](err error) D {
	var zero D
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if v, ok := d.(D); ok {
			return v
		}
	}
	return zero
}

// wantStatus fails t unless err is a status of code with reason; meta, when set, is the
// ErrorInfo's whole metadata; field, when set, the BadRequest's field.
func wantStatus(t *testing.T, what string, err error, code codes.Code, reason string, meta map[string]string, field string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Errorf("%s: %v; want %s", what, err, code)
		return
	}
	info := detail[*errdetails.ErrorInfo](err)
	if info == nil || info.Reason != reason || info.Domain != apierr.Domain {
		t.Errorf("%s: error info %v; want reason %s in domain %s", what, info, reason, apierr.Domain)
		return
	}
	if len(meta) != 0 || len(info.Metadata) != 0 {
		if fmt.Sprint(info.Metadata) != fmt.Sprint(meta) {
			t.Errorf("%s: metadata %v; want %v", what, info.Metadata, meta)
		}
	}
	br := detail[*errdetails.BadRequest](err)
	switch {
	case field == "" && br != nil:
		t.Errorf("%s: field violation %v on a %s", what, br, reason)
	case field != "" && (br == nil || len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != field || br.FieldViolations[0].Description == ""):
		t.Errorf("%s: field violation %v; want one on %s with its reason", what, br, field)
	}
}

// rawCodec sends a request's bytes as they are (*[]byte), so a test can put on the wire what
// no generated client would encode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// reserveBadUser sends a Reserve whose user_id (field 3) is not UTF-8.
func (f *fixture) reserveBadUser() error {
	b, err := proto.Marshal(&quotav1.ReserveRequest{SaleId: "s", Sku: "k", Quantity: 1, RequestKey: "utf8"})
	if err != nil {
		return err
	}
	b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), []byte("b\xffd"))
	var out []byte
	return f.conn.Invoke(f.ctx, "/quota.v1.RegionService/Reserve", &b, &out, grpc.ForceCodecV2(rawCodec{}))
}

func (f *fixture) reserve(sale, sku, user, key string, q int64) error {
	_, err := f.store.Reserve(f.ctx, &quotav1.ReserveRequest{SaleId: sale, Sku: sku, UserId: user, Quantity: q, RequestKey: key})
	return err
}

// TestErrorMapping: each outcome the region's server answers, reached through its real
// calls, has the code and reason of the one table (internal/apierr) and the details it
// sets: the field of a bad request, the leader a standby knows, the region a buyer is bound
// to, the retry-after of a full limiter.
func TestErrorMapping(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, tt := range f.errorCases(f.errorSetup(t)) {
		err := tt.call()
		wantStatus(t, tt.name, err, tt.code, tt.reason, tt.meta, tt.field)
		if ri := detail[*errdetails.RetryInfo](err); (tt.reason == "OVERLOADED") != (ri != nil && ri.RetryDelay.AsDuration() > 0) {
			t.Errorf("%s: retry info %v", tt.name, ri)
		}
	}
}

// errorCase is a call and the status it must be answered with.
type errorCase struct {
	name   string
	call   func() error
	code   codes.Code
	reason string
	meta   map[string]string
	field  string
}

// errorSetup makes the state the error cases need and returns the admission of a buyer
// bound at eu.
func (f *fixture) errorSetup(t *testing.T) string {
	t.Helper()
	f.sale(t, terms("s", 2, "k"), 10)
	f.sale(t, terms("big", 100, "k", "gone"), 10)
	later := terms("later", 1, "k")
	later.OpensAt = timestamppb.New(time.Now().Add(time.Hour))
	f.sale(t, later, 3)
	f.sale(t, terms("paused", 1, "k"), 3)
	if _, err := f.part.SetPaused(f.ctx, &quotav1.SetPausedRequest{Generation: 1, SaleId: "paused", Paused: true, Reason: "audit", Version: 1}); err != nil {
		t.Fatal(err)
	}
	room := terms("room", 1, "k")
	room.AdmitRate, room.TicketTtlMs, room.MaxLiveTickets = 50, 60_000, 100
	f.sale(t, room, 3)
	for i := range 3 {
		if err := f.reserve("big", "k", "keys", fmt.Sprint("key", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.reserve("s", "k", "u", "a", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.part.Credit(f.ctx, &quotav1.CreditRequest{Generation: 3, TransferId: "t3", SaleId: "s", Sku: "k", Units: 1}); err != nil {
		t.Fatal(err)
	}
	if err := f.reserve("s", "k", "u2", "b", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Enter(f.ctx, &quotav1.EnterRequest{SaleId: "room", UserId: "quick"}); err != nil {
		t.Fatal(err)
	}
	bound, err := f.store.Enter(f.ctx, &quotav1.EnterRequest{SaleId: "room", UserId: "bound"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the binding at eu", func() bool { return f.admissionOf("room", bound.Admission.AdmissionId) != nil })
	return bound.Admission.AdmissionId
}

func (f *fixture) admissionOf(sale, id string) error {
	_, err := f.store.GetAdmission(f.ctx, &quotav1.GetAdmissionRequest{SaleId: sale, AdmissionId: id})
	return err
}

// errorCases are the calls answered with each outcome the region's server can give.
func (f *fixture) errorCases(bound string) []errorCase {
	wraps := terms("wraps", 1, "k")
	wraps.HoldTtlMs = 1<<58 + 60_000 // 60 s once wrapped around
	noOpen := terms("noopen", 1, "k")
	noOpen.OpensAt = nil
	elsewhere := metadata.AppendToOutgoingContext(f.ctx, rpcserve.RegionHeader, "eu")
	return []errorCase{
		{"quantity 0", func() error { return f.reserve("s", "k", "u", "q0", 0) }, codes.InvalidArgument, "INVALID_ARGUMENT", nil, "quantity"},
		{"user_id not UTF-8", f.reserveBadUser, codes.InvalidArgument, "INVALID_ARGUMENT", nil, "user_id"},
		{"no terms", func() error { _, err := f.part.PutSale(f.ctx, &quotav1.PutSaleRequest{Generation: 1}); return err },
			codes.InvalidArgument, "INVALID_ARGUMENT", nil, "sale"},
		{"no opens_at", func() error {
			_, err := f.part.PutSale(f.ctx, &quotav1.PutSaleRequest{Generation: 1, Sale: noOpen})
			return err
		},
			codes.InvalidArgument, "INVALID_ARGUMENT", nil, "opens_at"},
		{"hold_ttl_ms wraps", func() error {
			_, err := f.part.PutSale(f.ctx, &quotav1.PutSaleRequest{Generation: 1, Sale: wraps})
			return err
		},
			codes.InvalidArgument, "INVALID_ARGUMENT", nil, "hold_ttl"},
		{"unknown hold", func() error {
			_, err := f.store.GetReservation(f.ctx, &quotav1.GetReservationRequest{HoldId: "us.0000000000000000000000000000"})
			return err
		}, codes.NotFound, "NOT_FOUND", nil, ""},
		{"over the limit", func() error { return f.reserve("s", "k", "u2", "b2", 1) }, codes.ResourceExhausted, "LIMIT_EXCEEDED", nil, ""},
		{"pool short", func() error { return f.reserve("big", "k", "u", "c", 20) }, codes.ResourceExhausted, "REGION_EXHAUSTED", nil, ""},
		{"flagged sold out", func() error { return f.reserve("big", "gone", "u3", "d", 20) }, codes.FailedPrecondition, "SOLD_OUT", nil, ""},
		{"key reused", func() error { return f.reserve("s", "k", "u", "a", 2) }, codes.AlreadyExists, "ALREADY_EXISTS", nil, ""},
		{"too many keys", func() error { return f.reserve("big", "k", "keys", "key3", 1) }, codes.ResourceExhausted, "TOO_MANY_KEYS", nil, ""},
		{"not open", func() error { return f.reserve("later", "k", "u", "e", 1) }, codes.FailedPrecondition, "NOT_OPEN", nil, ""},
		{"paused", func() error { return f.reserve("paused", "k", "u", "f", 1) }, codes.FailedPrecondition, "PAUSED", nil, ""},
		{"stale generation", func() error {
			_, err := f.part.Credit(f.ctx, &quotav1.CreditRequest{Generation: 2, TransferId: "t2", SaleId: "s", Sku: "k", Units: 1})
			return err
		}, codes.FailedPrecondition, "FENCED", nil, ""},
		{"no ticket", func() error { return f.reserve("room", "k", "u", "g", 1) }, codes.Unauthenticated, "TICKET_INVALID", nil, ""},
		{"bound elsewhere", func() error { return f.admissionOf("room", bound) },
			codes.FailedPrecondition, "BOUND_ELSEWHERE", map[string]string{"region": "eu"}, ""},
		{"entering too often", func() error {
			_, err := f.store.Enter(f.ctx, &quotav1.EnterRequest{SaleId: "room", UserId: "quick"})
			return err
		},
			codes.ResourceExhausted, "OVERLOADED", nil, ""},
		{"meant for another region", func() error {
			_, err := f.part.TransferStatus(elsewhere, &quotav1.TransferStatusRequest{TransferId: "t3"})
			return err
		}, codes.FailedPrecondition, "CONFLICT", nil, ""},
		{"no front door", func() error {
			_, err := f.standby.Enter(f.ctx, &quotav1.EnterRequest{SaleId: "room", UserId: "u"})
			return err
		},
			codes.FailedPrecondition, "CONFLICT", nil, ""},
		{"standby", func() error { return f.reserveOn(f.standby, "s", "k", "u", "h", 1) }, codes.Unavailable, "NOT_LEADER",
			map[string]string{"leader": leaderAt}, ""},
	}
}

func (f *fixture) reserveOn(c quotav1.RegionServiceClient, sale, sku, user, key string, q int64) error {
	_, err := c.Reserve(f.ctx, &quotav1.ReserveRequest{SaleId: sale, Sku: sku, UserId: user, Quantity: q, RequestKey: key})
	return err
}

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 s", what)
		}
	}
}

// wantReservation fails t unless pb is the hold the region has, field by field.
func (f *fixture) wantReservation(t *testing.T, what string, pb *quotav1.Reservation, state quotav1.HoldState) {
	t.Helper()
	h, err := f.r.GetReservation(f.ctx, pb.GetHoldId())
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	want := &quotav1.Reservation{HoldId: h.ID, SaleId: h.Sale, Sku: h.SKU, UserId: h.User, Quantity: int64(h.Quantity), RequestKey: h.RequestKey,
		State: state, ExpiresAt: timestamppb.New(h.ExpiresAt), PaymentId: h.PaymentID, Region: h.Region, AdmissionId: h.Admission}
	if !proto.Equal(pb, want) || h.Region != "us" {
		t.Errorf("%s: %v; the region has %+v (want state %s)", what, pb, h, state)
	}
}

// TestStorefrontAnswers: a reservation answered over the wire is the region's hold in each
// state, a confirm says SOLD or REFUND, and the stock and the sale's description are the
// region's counts and terms.
func TestStorefrontAnswers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.sale(t, terms("s", 5, "k", "j"), 10)
	req := &quotav1.ReserveRequest{SaleId: "s", Sku: "k", UserId: "u", Quantity: 2, RequestKey: "a"}
	res, err := f.store.Reserve(f.ctx, req)
	if err != nil || res.Replayed {
		t.Fatalf("reserve: %v, %v", res, err)
	}
	f.wantReservation(t, "reserve", res.Reservation, quotav1.HoldState_HOLD_STATE_HELD)
	again, err := f.store.Reserve(f.ctx, req)
	if err != nil || !again.Replayed || !proto.Equal(again.Reservation, res.Reservation) {
		t.Errorf("replayed reserve: %v, %v; want %v replayed", again, err, res.Reservation)
	}
	other, err := f.store.Reserve(f.ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "j", UserId: "u", Quantity: 1, RequestKey: "b"})
	if err != nil {
		t.Fatal(err)
	}
	conf, err := f.store.Confirm(f.ctx, &quotav1.ConfirmRequest{HoldId: res.Reservation.HoldId, PaymentId: "pay-1"})
	if err != nil || conf.Outcome != quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD || conf.Reservation.PaymentId != "pay-1" {
		t.Fatalf("confirm: %v, %v", conf, err)
	}
	f.wantReservation(t, "confirm", conf.Reservation, quotav1.HoldState_HOLD_STATE_SOLD)
	rel, err := f.store.Release(f.ctx, &quotav1.ReleaseRequest{HoldId: other.Reservation.HoldId})
	if err != nil {
		t.Fatal(err)
	}
	f.wantReservation(t, "release", rel.Reservation, quotav1.HoldState_HOLD_STATE_RELEASED)
	late, err := f.store.Confirm(f.ctx, &quotav1.ConfirmRequest{HoldId: other.Reservation.HoldId, PaymentId: "pay-2"})
	if err != nil || late.Outcome != quotav1.ConfirmOutcome_CONFIRM_OUTCOME_REFUND || late.Reason == "" {
		t.Errorf("confirm of a released hold: %v, %v; want REFUND with a reason", late, err)
	}
	got, err := f.store.GetReservation(f.ctx, &quotav1.GetReservationRequest{HoldId: res.Reservation.HoldId})
	if err != nil || !proto.Equal(got.Reservation, conf.Reservation) {
		t.Errorf("get reservation: %v, %v; want %v", got, err, conf.Reservation)
	}
	f.wantStock(t, "s")
	f.wantDescription(t, "s")
}

func (f *fixture) wantStock(t *testing.T, sale string) {
	t.Helper()
	stock, err := f.store.GetStock(f.ctx, &quotav1.GetStockRequest{SaleId: sale})
	if err != nil {
		t.Fatal(err)
	}
	pools, err := f.r.Stock(f.ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	want := &quotav1.GetStockResponse{SaleId: sale}
	for _, p := range pools {
		want.Pools = append(want.Pools, &quotav1.Pool{Region: "us", Sku: p.SKU, Available: int64(p.Available), Held: int64(p.Held),
			Sold: int64(p.Sold), CreditedIn: int64(p.CreditedIn), DebitedOut: int64(p.DebitedOut)})
	}
	if !proto.Equal(stock, want) || len(want.Pools) == 0 {
		t.Errorf("stock %v; the region has %+v", stock, pools)
	}
}

func (f *fixture) wantDescription(t *testing.T, sale string) {
	t.Helper()
	d, err := f.store.DescribeSale(f.ctx, &quotav1.DescribeSaleRequest{SaleId: sale})
	if err != nil {
		t.Fatal(err)
	}
	pools, err := f.r.Stock(f.ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	if d.SaleId != sale || d.Region != "us" || d.PerUserLimit != 5 || d.HoldTtlMs != 600_000 ||
		d.OpensAt.CheckValid() != nil || d.ServerTime.CheckValid() != nil || time.Since(d.ServerTime.AsTime()).Abs() > time.Minute || d.Paused {
		t.Errorf("description %v", d)
	}
	if len(d.Skus) != len(pools) {
		t.Fatalf("description's skus %v; the region's pools %+v", d.Skus, pools)
	}
	for _, p := range pools {
		want := &quotav1.SkuView{Sku: p.SKU, Available: int64(p.Available)}
		if i := slices.IndexFunc(d.Skus, func(v *quotav1.SkuView) bool { return v.Sku == p.SKU }); i < 0 || !proto.Equal(d.Skus[i], want) {
			t.Errorf("description's skus %v; want %v among them", d.Skus, want)
		}
	}
}

// TestParticipantAnswers: each transfer step answers the region's durable record as its
// state string, the status call both records, and a pause its record.
func TestParticipantAnswers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.sale(t, terms("s", 5, "k"), 10)
	step := func(name string, call func() (string, error), want transfer.InState, wantOut transfer.OutState) {
		t.Helper()
		got, err := call()
		if err != nil || (got != string(want) && got != string(wantOut)) {
			t.Errorf("%s: %q, %v; want %q%q", name, got, err, want, wantOut)
		}
	}
	const sale = "s"
	step("credit", func() (string, error) {
		r, err := f.part.Credit(f.ctx, &quotav1.CreditRequest{Generation: 1, TransferId: "t-in", SaleId: sale, Sku: "k", Units: 2})
		return r.GetState(), err
	}, transfer.InCredited, "")
	step("refuse", func() (string, error) {
		r, err := f.part.Refuse(f.ctx, &quotav1.RefuseRequest{Generation: 1, TransferId: "t-refused", SaleId: sale, Sku: "k", Units: 2})
		return r.GetState(), err
	}, transfer.InRefused, "")
	for _, out := range []string{"t-settle", "t-restore"} {
		step("debit "+out, func() (string, error) {
			r, err := f.part.Debit(f.ctx, &quotav1.DebitRequest{Generation: 1, TransferId: out, SaleId: sale, Sku: "k", To: "eu", Units: 3})
			return r.GetState(), err
		}, "", transfer.OutPending)
	}
	step("settle", func() (string, error) {
		r, err := f.part.Settle(f.ctx, &quotav1.SettleRequest{Generation: 1, TransferId: "t-settle", SaleId: sale})
		return r.GetState(), err
	}, "", transfer.OutSettled)
	step("restore", func() (string, error) {
		r, err := f.part.Restore(f.ctx, &quotav1.RestoreRequest{Generation: 1, TransferId: "t-restore", SaleId: sale})
		return r.GetState(), err
	}, "", transfer.OutVoided)
	step("refuse debit", func() (string, error) {
		r, err := f.part.RefuseDebit(f.ctx, &quotav1.RefuseDebitRequest{Generation: 1, TransferId: "t-never", SaleId: sale, Sku: "k", To: "eu", Units: 1})
		return r.GetState(), err
	}, "", transfer.OutRefused)
	for _, id := range []string{"t-in", "t-refused", "t-settle", "t-restore", "t-never", "t-unknown"} {
		st, err := f.part.TransferStatus(f.ctx, &quotav1.TransferStatusRequest{TransferId: id})
		want, derr := f.r.Status(f.ctx, id)
		if err != nil || derr != nil || st.Inbound != string(want.In) || st.Outbound != string(want.Out) {
			t.Errorf("status of %s: %v, %v; the region has %+v, %v", id, st, err, want, derr)
		}
	}
	p, err := f.part.SetPaused(f.ctx, &quotav1.SetPausedRequest{Generation: 1, SaleId: "s", Sku: "k", Paused: true, Reason: "why", Version: 4})
	if err != nil || !p.Paused || p.Version != 4 {
		t.Errorf("pause: %v, %v; want paused at version 4", p, err)
	}
	if got := f.r.Paused()["s"]["k"]; got != "why" {
		t.Errorf("the region's pause of s/k: %q", got)
	}
	p, err = f.part.SetPaused(f.ctx, &quotav1.SetPausedRequest{Generation: 1, SaleId: "s", Sku: "k", Version: 5})
	if err != nil || p.Paused || p.Version != 5 {
		t.Errorf("resume: %v, %v; want resumed at version 5", p, err)
	}
}

// storedTerms reads a sale's terms from the region's database.
func (f *fixture) storedTerms(t *testing.T, sale string) region.SaleTerms {
	t.Helper()
	tm := region.SaleTerms{Sale: sale}
	var limit, ttl, ticketTTL int64
	err := f.pool.QueryRow(f.ctx, `SELECT skus, per_user_limit, hold_ttl_ms, opens_at, admit_rate, ticket_ttl_ms, max_live_tickets
		FROM sales WHERE sale_id = $1`, sale).Scan(&tm.SKUs, &limit, &ttl, &tm.OpensAt, &tm.Admission.Rate, &ticketTTL, &tm.Admission.MaxLive)
	if err != nil {
		t.Fatalf("read sale %s: %v", sale, err)
	}
	tm.PerUserLimit, tm.HoldTTL, tm.Admission.TicketTTL = transfer.Units(limit), time.Duration(ttl)*time.Millisecond, time.Duration(ticketTTL)*time.Millisecond
	return tm
}

// TestPutSaleRoundTrip: generated terms, sent over the wire as a coordinator sends them,
// are the terms the region records, every field; sent again they are the same terms.
func TestPutSaleRoundTrip(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	g := rand.New(rand.NewPCG(11, 12))
	ms := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(g.Int64N(int64((hi-lo)/time.Millisecond)+1))*time.Millisecond
	}
	for i := range 20 {
		tm := region.SaleTerms{Sale: fmt.Sprint("sale-", i), PerUserLimit: transfer.Units(1 + g.Int64N(int64(transfer.MaxUnits))),
			HoldTTL: ms(time.Second, 24*time.Hour), OpensAt: time.UnixMicro(g.Int64N(4e15)).UTC()}
		for j := range 1 + g.IntN(3) {
			tm.SKUs = append(tm.SKUs, fmt.Sprint("sku-", j))
		}
		if i%2 == 1 {
			tm.Admission = transfer.AdmissionTerms{Rate: 1 + g.Int64N(transfer.MaxAdmitRate), TicketTTL: ms(10*time.Second, time.Hour),
				MaxLive: 1 + g.Int64N(transfer.MaxLiveTickets)}
		}
		pb := &quotav1.SaleTerms{SaleId: tm.Sale, Skus: tm.SKUs, PerUserLimit: int64(tm.PerUserLimit), HoldTtlMs: tm.HoldTTL.Milliseconds(),
			OpensAt: timestamppb.New(tm.OpensAt), AdmitRate: tm.Admission.Rate, TicketTtlMs: tm.Admission.TicketTTL.Milliseconds(),
			MaxLiveTickets: tm.Admission.MaxLive}
		for range 2 {
			if _, err := f.part.PutSale(f.ctx, &quotav1.PutSaleRequest{Generation: 1, Sale: pb}); err != nil {
				t.Fatalf("put sale %+v: %v", tm, err)
			}
		}
		got := f.storedTerms(t, tm.Sale)
		got.OpensAt = got.OpensAt.UTC()
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tm) {
			t.Fatalf("sent %+v; the region recorded %+v", tm, got)
		}
	}
}

// TestAdmissionOverTheWire: a buyer's admission, polled until admitted, is the door's entry
// with a ticket the region accepts; the hold it backs names it; the ticket backs one
// request key only (TICKET_USED), and the admission then reads as used.
func TestAdmissionOverTheWire(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	room := terms("room", 1, "k")
	room.AdmitRate, room.TicketTtlMs, room.MaxLiveTickets = 50, 60_000, 100
	f.sale(t, room, 3)
	in, err := f.store.Enter(f.ctx, &quotav1.EnterRequest{SaleId: "room", UserId: "u"})
	if err != nil {
		t.Fatal(err)
	}
	a := in.Admission
	if a.AdmissionId == "" || a.SaleId != "room" || a.UserId != "u" {
		t.Fatalf("enter: %v", a)
	}
	if a.State == quotav1.AdmissionState_ADMISSION_STATE_QUEUED && (a.RetryAfterMs < 250 || a.RetryAfterMs > 5000) {
		t.Errorf("queued with retry_after_ms %d", a.RetryAfterMs)
	}
	waitFor(t, "ticket", func() bool {
		got, err := f.store.GetAdmission(f.ctx, &quotav1.GetAdmissionRequest{SaleId: "room", AdmissionId: a.AdmissionId})
		if err != nil {
			t.Fatal(err)
		}
		a = got.Admission
		return a.State == quotav1.AdmissionState_ADMISSION_STATE_ADMITTED
	})
	tk, err := admission.ParseToken(a.Ticket)
	if err != nil {
		t.Fatalf("ticket %q: %v", a.Ticket, err)
	}
	if tk.Ticket.Admission != a.AdmissionId || tk.Ticket.User != "u" || tk.Ticket.Sale != "room" || tk.Ticket.Region != "us" ||
		a.ExpiresAt.CheckValid() != nil || !a.ExpiresAt.AsTime().Truncate(time.Millisecond).Equal(tk.Ticket.Expires) || a.RetryAfterMs != 0 || a.Position != 0 {
		t.Errorf("admitted: %v; its ticket says %+v", a, tk.Ticket)
	}
	res, err := f.store.Reserve(f.ctx, &quotav1.ReserveRequest{SaleId: "room", Sku: "k", UserId: "u", Quantity: 1, RequestKey: "a", Ticket: a.Ticket})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reservation.AdmissionId != a.AdmissionId {
		t.Errorf("the hold names admission %q, want %q", res.Reservation.AdmissionId, a.AdmissionId)
	}
	f.wantReservation(t, "reserve with a ticket", res.Reservation, quotav1.HoldState_HOLD_STATE_HELD)
	_, err = f.store.Reserve(f.ctx, &quotav1.ReserveRequest{SaleId: "room", Sku: "k", UserId: "u", Quantity: 1, RequestKey: "b", Ticket: a.Ticket})
	wantStatus(t, "a ticket's second key", err, codes.AlreadyExists, "TICKET_USED", nil, "")
	got, err := f.store.GetAdmission(f.ctx, &quotav1.GetAdmissionRequest{SaleId: "room", AdmissionId: a.AdmissionId})
	if err != nil || got.Admission.State != quotav1.AdmissionState_ADMISSION_STATE_USED {
		t.Errorf("after the reservation: %v, %v; want USED", got, err)
	}
}
