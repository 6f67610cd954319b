package coordrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/coordinator/coordrpc"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/netfault"
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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var quiet = slog.New(slog.DiscardHandler)

// leaderAt is the address the standby of region us names as its leader.
const leaderAt = "127.0.0.1:7"

// regionNode is a region leading on its own database, served over loopback as quotad
// serves it (rpcserve, the region guard).
type regionNode struct {
	r    *region.Region
	pool *pgxpool.Pool
	addr string
}

// listen serves register's services over loopback; stopped when t ends.
func listen(t *testing.T, opts rpcserve.Options, register func(*grpc.Server)) string {
	t.Helper()
	opts.Logger = quiet
	srv, err := rpcserve.Listen("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	register(srv.GRPC)
	srv.Start()
	t.Cleanup(srv.Stop)
	return srv.Addr()
}

func startRegion(t *testing.T, name string, pool *pgxpool.Pool, lead bool) regionNode {
	t.Helper()
	n := regionNode{pool: pool}
	cfg := region.Config{Name: name, Logger: quiet, Sweep: region.SweepConfig{Interval: time.Hour}, Cluster: region.ClusterView{LeaderHint: func() string { return leaderAt }}}
	var err error
	if n.r, err = region.New(cfg, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.r.Close)
	if lead {
		if err := n.r.Lead(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	n.addr = listen(t, rpcserve.Options{Guards: []grpc.UnaryServerInterceptor{rpcserve.AddressedTo(name)}}, func(s *grpc.Server) {
		quotav1.RegisterParticipantServiceServer(s, &regionrpc.Server{R: n.r})
	})
	return n
}

func newRegion(t *testing.T, name string) regionNode {
	t.Helper()
	pool, _ := testpg.NewPool(t, "coordrpc_"+name, 8)
	if err := region.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return startRegion(t, name, pool, true)
}

// dial is a participant of region name at addr, as the coordinator dials it.
func dial(t *testing.T, name, addr string) *coordrpc.Participant {
	t.Helper()
	p, err := coordrpc.DialResolving(name, addr, nil, insecure.NewCredentials())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// stack is regions us and eu, a coordinator leading over them on its own database, served
// over loopback, and a second coordinator on the same ledger that does not lead.
type stack struct {
	ctx     context.Context
	regions map[string]regionNode
	c       *coordinator.Coordinator
	client  quotav1.CoordinatorServiceClient
	standby quotav1.CoordinatorServiceClient
}

func client(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func newStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{ctx: context.Background(), regions: map[string]regionNode{"us": newRegion(t, "us"), "eu": newRegion(t, "eu")}}
	db, _ := testpg.NewPool(t, "coordrpc", 8)
	if err := coordinator.Migrate(s.ctx, db); err != nil {
		t.Fatal(err)
	}
	var links []coordinator.RegionLink
	for _, name := range []string{"us", "eu"} {
		n := s.regions[name]
		links = append(links, coordinator.RegionLink{Name: name, Address: n.addr, Participant: dial(t, name, n.addr),
			Books: func(ctx context.Context, sale string) (transfer.RegionBooks, error) {
				return region.ReadBooks(ctx, n.pool, name, sale)
			},
			Demand: func(ctx context.Context, sale string, since time.Time) (map[string]transfer.Units, error) {
				return region.RecentDemand(ctx, n.pool, sale, since)
			}})
	}
	serveCoordinator := func(c *coordinator.Coordinator) quotav1.CoordinatorServiceClient {
		addr := listen(t, rpcserve.Options{}, func(g *grpc.Server) { quotav1.RegisterCoordinatorServiceServer(g, &coordrpc.Server{C: c}) })
		return quotav1.NewCoordinatorServiceClient(client(t, addr))
	}
	for i, lead := range []bool{true, false} {
		c, err := coordinator.New(coordinator.Config{Regions: links, Logger: quiet, RetryInterval: time.Hour}, db)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if !lead {
			s.standby = serveCoordinator(c)
			continue
		}
		if err := c.Lead(s.ctx, int64(i+1)); err != nil {
			t.Fatal(err)
		}
		s.c, s.client = c, serveCoordinator(c)
	}
	return s
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

// wantStatus fails t unless err is a status of code with reason and, when field is set, a
// field violation naming it.
func wantStatus(t *testing.T, what string, err error, code codes.Code, reason, field string) {
	t.Helper()
	st, _ := status.FromError(err)
	if err == nil || st.Code() != code || apierr.Reason(err) != reason {
		t.Errorf("%s: %v; want %s %s", what, err, code, reason)
		return
	}
	br := detail[*errdetails.BadRequest](err)
	if (field == "") != (br == nil) || (br != nil && br.FieldViolations[0].Field != field) {
		t.Errorf("%s: field violation %v; want one on %q", what, br, field)
	}
}

func saleRequest(id string) *quotav1.CreateSaleRequest {
	return &quotav1.CreateSaleRequest{SaleId: id, PerUserLimit: 2, HoldTtlMs: 120_000, OpensAt: timestamppb.New(time.Now().Add(-time.Minute).Truncate(time.Millisecond)),
		AdmitRate: 50, TicketTtlMs: 60_000, MaxLiveTickets: 100, Rebalance: "manual",
		Skus: []*quotav1.SkuTotal{{Sku: "k", Total: 10}, {Sku: "j", Total: 4}}}
}

// TestCoordinatorAnswers: what the served coordinator answers is the coordinator's own: the
// sale created as asked (and replayed), its allocation's transfers as the ledger has them,
// only the unfinished ones when asked, the audit of what the regions hold, the regions, a
// pause and its resume reaching both regions, a rebalance and a plan under their policies.
func TestCoordinatorAnswers(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	req := saleRequest("drop")
	created, err := s.client.CreateSale(s.ctx, req)
	if err != nil || created.Replayed {
		t.Fatalf("create: %v, %v", created, err)
	}
	sale := created.Sale
	if sale.SaleId != req.SaleId || sale.PerUserLimit != req.PerUserLimit || sale.HoldTtlMs != req.HoldTtlMs || !proto.Equal(sale.OpensAt, req.OpensAt) ||
		sale.AdmitRate != req.AdmitRate || sale.TicketTtlMs != req.TicketTtlMs || sale.MaxLiveTickets != req.MaxLiveTickets || sale.Rebalance != req.Rebalance ||
		len(sale.Skus) != 2 || sale.CreatedAt.CheckValid() != nil {
		t.Errorf("created %v; asked %v", sale, req)
	}
	for _, k := range req.Skus {
		if i := slices.IndexFunc(sale.Skus, func(l *quotav1.SkuLedger) bool { return l.Sku == k.Sku }); i < 0 || sale.Skus[i].Total != k.Total || sale.Skus[i].Unallocated != k.Total {
			t.Errorf("created sale's skus %v; want %v all unallocated", sale.Skus, k)
		}
	}
	again, err := s.client.CreateSale(s.ctx, req)
	if err != nil || !again.Replayed || !proto.Equal(again.Sale, sale) {
		t.Errorf("create again: %v, %v; want %v replayed", again, err, sale)
	}
	alloc, err := s.client.Allocate(s.ctx, &quotav1.AllocateRequest{SaleId: "drop", RequestId: "a1",
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}, {Region: "eu", Weight: 1}}})
	if err != nil || len(alloc.Transfers) != 4 {
		t.Fatalf("allocate: %v, %v", alloc, err)
	}
	for _, tr := range alloc.Transfers {
		s.wantTransfer(t, tr)
	}
	all, err := s.client.ListTransfers(s.ctx, &quotav1.ListTransfersRequest{SaleId: "drop"})
	if err != nil || len(all.Transfers) != 4 {
		t.Fatalf("list: %v, %v", all, err)
	}
	for _, tr := range all.Transfers {
		s.wantTransfer(t, tr)
	}
	open, err := s.client.ListTransfers(s.ctx, &quotav1.ListTransfersRequest{SaleId: "drop", UnfinishedOnly: true})
	if err != nil || len(open.Transfers) != 0 {
		t.Errorf("unfinished transfers of a finished allocation: %v, %v", open, err)
	}
	s.wantAudit(t, "drop")
	regions, err := s.client.ListRegions(s.ctx, &quotav1.ListRegionsRequest{})
	if err != nil || regions.Generation != 1 || len(regions.Regions) != 2 || regions.Regions[0].Name != "us" || regions.Regions[0].Address != s.regions["us"].addr ||
		regions.Regions[1].Name != "eu" || regions.Regions[1].Address != s.regions["eu"].addr {
		t.Errorf("regions: %v, %v", regions, err)
	}
	s.wantPauseAndResume(t)
	s.wantRebalanceAndPlan(t)
}

// wantTransfer fails t unless pb is the transfer the ledger has.
func (s *stack) wantTransfer(t *testing.T, pb *quotav1.TransferInfo) {
	t.Helper()
	tr, err := s.c.GetTransfer(s.ctx, pb.TransferId)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(pb, coordrpc.TransferToProto(tr)) || pb.State != string(transfer.Posted) || pb.SaleId != "drop" || pb.From != transfer.Unallocated {
		t.Errorf("transfer %v; the ledger has %+v", pb, tr)
	}
	got, err := s.client.GetTransfer(s.ctx, &quotav1.GetTransferRequest{TransferId: pb.TransferId})
	if err != nil || !proto.Equal(got.Transfer, pb) {
		t.Errorf("get transfer %s: %v, %v", pb.TransferId, got, err)
	}
}

// wantAudit fails t unless the served audit of sale is the regions' counts, conserved.
func (s *stack) wantAudit(t *testing.T, sale string) {
	t.Helper()
	rep, err := s.client.Audit(s.ctx, &quotav1.AuditRequest{SaleId: sale})
	if err != nil || !rep.Ok || len(rep.Violations) != 0 || len(rep.Skus) != 2 || rep.At.CheckValid() != nil {
		t.Fatalf("audit: %v, %v", rep, err)
	}
	for _, a := range rep.Skus {
		var avail int64
		for _, ra := range a.Regions {
			n := s.regions[ra.Region]
			pools, err := n.r.Stock(s.ctx, sale)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(pools, func(p region.PoolCounts) bool { return p.SKU == a.Sku })
			if i < 0 || !ra.Reachable || ra.Available != int64(pools[i].Available) || ra.CreditedIn != int64(pools[i].CreditedIn) ||
				ra.Held != int64(pools[i].Held) || ra.Sold != int64(pools[i].Sold) || ra.DebitedOut != int64(pools[i].DebitedOut) {
				t.Errorf("audit of %s at %s: %v; the region has %+v", a.Sku, ra.Region, ra, pools)
			}
			avail += ra.Available
		}
		if a.SaleId != sale || !a.Ok || len(a.Regions) != 2 || a.Available != avail || a.Total != a.Available+a.Unallocated+a.Held+a.Sold+a.InFlight {
			t.Errorf("audit of %s: %v", a.Sku, a)
		}
	}
}

func (s *stack) wantPauseAndResume(t *testing.T) {
	t.Helper()
	p, err := s.client.PauseSale(s.ctx, &quotav1.PauseSaleRequest{SaleId: "drop", Sku: "k", Reason: "looks wrong"})
	if err != nil || !slices.Equal(sortStrings(p.Reached), []string{"eu", "us"}) || len(p.Unreached) != 0 || len(p.Sale.Pauses) != 1 {
		t.Fatalf("pause: %v, %v", p, err)
	}
	if ps := p.Sale.Pauses[0]; ps.SaleId != "drop" || ps.Sku != "k" || !ps.Paused || ps.Reason != "looks wrong" || ps.Version < 1 || ps.ChangedAt.CheckValid() != nil {
		t.Errorf("the sale's pause: %v", ps)
	}
	for name, n := range s.regions {
		if got := n.r.Paused()["drop"]["k"]; got != "looks wrong" {
			t.Errorf("region %s's pause of drop/k: %q", name, got)
		}
	}
	r, err := s.client.ResumeSale(s.ctx, &quotav1.ResumeSaleRequest{SaleId: "drop", Sku: "k"})
	if err != nil || len(r.Reached) != 2 || len(r.Unreached) != 0 || len(r.Sale.Pauses) != 0 {
		t.Errorf("resume: %v, %v", r, err)
	}
}

func sortStrings(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func (s *stack) wantRebalanceAndPlan(t *testing.T) {
	t.Helper()
	rb, err := s.client.Rebalance(s.ctx, &quotav1.RebalanceRequest{SaleId: "drop", Sku: "k", WindowMs: 60_000, HorizonMs: 120_000, MinUnits: 1, DryRun: true})
	if err != nil || rb.Replayed || len(rb.Transfers) != 0 || len(rb.Moves) != 0 {
		t.Fatalf("dry rebalance with no demand: %v, %v", rb, err)
	}
	for _, d := range rb.Pools {
		if d.Pool == transfer.Unallocated && d.Available == 0 {
			continue // all allocated
		}
		if d.Recent != 0 || d.Need != 0 || (d.Pool != "us" && d.Pool != "eu") || d.Available != 5 {
			t.Errorf("pool with no demand: %v", d)
		}
	}
	plan, err := s.client.PlanRebalance(s.ctx, &quotav1.PlanRebalanceRequest{SaleId: "drop"})
	p := s.c.AutoPolicy()
	if err != nil || plan.SaleId != "drop" || plan.Mode != "manual" || plan.Enabled || plan.WindowMs != p.Window.Milliseconds() ||
		plan.HorizonMs != p.Horizon.Milliseconds() || plan.MinUnits != int64(p.MinUnits) || len(plan.Skus) != 2 {
		t.Fatalf("plan: %v, %v; policy %+v", plan, err, p)
	}
	for _, k := range plan.Skus {
		for _, d := range k.Pools {
			if d.Pool != transfer.Unallocated && (d.EmptyInMs != -1 || d.PerSecond != 0) {
				t.Errorf("a pool with no demand never runs out: %v", d)
			}
		}
	}
}

// TestCoordinatorErrors: what the served coordinator refuses has the table's code and
// reason, the field of a bad request among them (a TTL or window no duration holds was
// accepted as another before the adapter checked it: hold_ttl_ms 2^58+60,000 made a sale of
// 60 s holds).
func TestCoordinatorErrors(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	if _, err := s.client.CreateSale(s.ctx, saleRequest("drop")); err != nil {
		t.Fatal(err)
	}
	const wrapsTo60s = 1<<58 + 60_000
	edit := func(id string, fn func(*quotav1.CreateSaleRequest)) *quotav1.CreateSaleRequest {
		r := saleRequest(id)
		fn(r)
		return r
	}
	create := func(r *quotav1.CreateSaleRequest) func() error {
		return func() error { _, err := s.client.CreateSale(s.ctx, r); return err }
	}
	createAtStandby := func(r *quotav1.CreateSaleRequest) func() error {
		return func() error { _, err := s.standby.CreateSale(s.ctx, r); return err }
	}
	for _, tt := range []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
		field  string
	}{
		{"hold_ttl_ms wraps", create(edit("w1", func(r *quotav1.CreateSaleRequest) { r.HoldTtlMs = wrapsTo60s })), codes.InvalidArgument, "INVALID_ARGUMENT", "hold_ttl"},
		{"ticket_ttl_ms wraps", create(edit("w2", func(r *quotav1.CreateSaleRequest) { r.TicketTtlMs = wrapsTo60s })), codes.InvalidArgument, "INVALID_ARGUMENT", "ticket_ttl"},
		{"opens_at invalid", create(edit("w3", func(r *quotav1.CreateSaleRequest) { r.OpensAt = &timestamppb.Timestamp{Nanos: -1} })), codes.InvalidArgument, "INVALID_ARGUMENT", "opens_at"},
		{"hold_ttl_ms 0", create(edit("w4", func(r *quotav1.CreateSaleRequest) { r.HoldTtlMs = 0 })), codes.InvalidArgument, "INVALID_ARGUMENT", "hold_ttl"},
		{"other terms", create(edit("drop", func(r *quotav1.CreateSaleRequest) { r.PerUserLimit = 3 })), codes.AlreadyExists, "ALREADY_EXISTS", ""},
		{"unknown sale", func() error { _, err := s.client.GetSale(s.ctx, &quotav1.GetSaleRequest{SaleId: "nope"}); return err }, codes.NotFound, "NOT_FOUND", ""},
		{"window_ms wraps", func() error {
			_, err := s.client.Rebalance(s.ctx, &quotav1.RebalanceRequest{SaleId: "drop", Sku: "k", WindowMs: wrapsTo60s, HorizonMs: 1000, MinUnits: 1, DryRun: true})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT", "policy"},
		{"not leading", createAtStandby(saleRequest("w5")), codes.Unavailable, "NOT_LEADER", ""},
		{"not leading, allocating", func() error {
			_, err := s.standby.Allocate(s.ctx, &quotav1.AllocateRequest{SaleId: "drop", RequestId: "a", Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}})
			return err
		}, codes.Unavailable, "NOT_LEADER", ""},
	} {
		wantStatus(t, tt.name, tt.call(), tt.code, tt.reason, tt.field)
	}
	for _, id := range []string{"w1", "w2", "w3", "w5"} {
		if _, err := s.c.GetSale(s.ctx, id); !errors.Is(err, apierr.ErrNotFound) {
			t.Errorf("sale %s was created from a request refused: %v", id, err)
		}
	}
}

// storedTerms reads a sale's terms from a region's database.
func storedTerms(t *testing.T, pool *pgxpool.Pool, sale string) coordinator.SaleTerms {
	t.Helper()
	tm := coordinator.SaleTerms{Sale: sale}
	var limit, ttl, ticketTTL int64
	err := pool.QueryRow(context.Background(), `SELECT skus, per_user_limit, hold_ttl_ms, opens_at, admit_rate, ticket_ttl_ms, max_live_tickets
		FROM sales WHERE sale_id = $1`, sale).Scan(&tm.SKUs, &limit, &ttl, &tm.OpensAt, &tm.Admission.Rate, &ticketTTL, &tm.Admission.MaxLive)
	if err != nil {
		t.Fatalf("read sale %s: %v", sale, err)
	}
	tm.PerUserLimit, tm.HoldTTL, tm.Admission.TicketTTL = transfer.Units(limit), time.Duration(ttl)*time.Millisecond, time.Duration(ticketTTL)*time.Millisecond
	tm.OpensAt = tm.OpensAt.UTC()
	return tm
}

// TestPutSaleRoundTrip: generated terms a coordinator puts through its participant client
// are the terms the region records (domain → proto → domain), every field.
func TestPutSaleRoundTrip(t *testing.T) {
	t.Parallel()
	us := newRegion(t, "us")
	p := dial(t, "us", us.addr)
	g := rand.New(rand.NewPCG(21, 22))
	ms := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(g.Int64N(int64((hi-lo)/time.Millisecond)+1))*time.Millisecond
	}
	for i := range 20 {
		tm := coordinator.SaleTerms{Sale: fmt.Sprint("sale-", i), PerUserLimit: transfer.Units(1 + g.Int64N(int64(transfer.MaxUnits))),
			HoldTTL: ms(time.Second, 24*time.Hour), OpensAt: time.UnixMicro(g.Int64N(4e15)).UTC()}
		for j := range 1 + g.IntN(3) {
			tm.SKUs = append(tm.SKUs, fmt.Sprint("sku-", j))
		}
		if i%2 == 1 {
			tm.Admission = transfer.AdmissionTerms{Rate: 1 + g.Int64N(transfer.MaxAdmitRate), TicketTTL: ms(10*time.Second, time.Hour),
				MaxLive: 1 + g.Int64N(transfer.MaxLiveTickets)}
		}
		if err := p.PutSale(context.Background(), 1, tm); err != nil {
			t.Fatalf("put sale %+v: %v", tm, err)
		}
		if got := storedTerms(t, us.pool, tm.Sale); fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tm) {
			t.Fatalf("put %+v; the region recorded %+v", tm, got)
		}
	}
}

// TestParticipantClient: each step the coordinator asks of a region comes back as the
// region's record, typed; each refusal comes back as the domain's sentinel (errors.Is),
// with the field, or the leader, the status carried.
func TestParticipantClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	us := newRegion(t, "us")
	p := dial(t, "us", us.addr)
	terms := coordinator.SaleTerms{Sale: "s", SKUs: []string{"k"}, PerUserLimit: 1, HoldTTL: time.Minute, OpensAt: time.Now()}
	if err := p.PutSale(ctx, 1, terms); err != nil {
		t.Fatal(err)
	}
	tr := func(id string, units transfer.Units) transfer.Transfer {
		return transfer.Transfer{ID: id, Sale: "s", SKU: "k", From: "us", To: "eu", Units: units}
	}
	in := func(st transfer.InState, err error) string { return fmt.Sprint(st, " ", err) }
	out := func(st transfer.OutState, err error) string { return fmt.Sprint(st, " ", err) }
	for _, step := range []struct{ name, got, want string }{
		{"credit", in(p.Credit(ctx, 1, tr("c1", 5))), "credited <nil>"},
		{"refuse", in(p.Refuse(ctx, 1, tr("r1", 5))), "refused <nil>"},
		{"debit", out(p.Debit(ctx, 1, tr("d1", 2))), "pending <nil>"},
		{"settle", out(p.Settle(ctx, 1, tr("d1", 2))), "settled <nil>"},
		{"debit again", out(p.Debit(ctx, 1, tr("d2", 1))), "pending <nil>"},
		{"restore", out(p.Restore(ctx, 1, tr("d2", 1))), "voided <nil>"},
		{"refuse debit", out(p.RefuseDebit(ctx, 1, tr("d3", 1))), "refused <nil>"},
	} {
		if step.got != step.want {
			t.Errorf("%s: %s, want %s", step.name, step.got, step.want)
		}
	}
	for id, want := range map[string]string{"c1": "credited ", "d1": " settled", "r1": "refused ", "d3": " refused", "none": " "} {
		i, o, err := p.Status(ctx, id)
		if err != nil || string(i)+" "+string(o) != want {
			t.Errorf("status of %s: %q %q %v; want %q", id, i, o, err, want)
		}
	}
	paused, v, err := p.SetPaused(ctx, 1, coordinator.Pause{Sale: "s", SKU: "k", Paused: true, Reason: "why", Version: 3})
	if err != nil || !paused || v != 3 {
		t.Errorf("pause: %v %d %v", paused, v, err)
	}
	wantParticipantErrors(t, us, p, terms)
}

func wantParticipantErrors(t *testing.T, us regionNode, p *coordrpc.Participant, terms coordinator.SaleTerms) {
	t.Helper()
	ctx := context.Background()
	if _, err := p.Credit(ctx, 5, transfer.Transfer{ID: "c5", Sale: "s", SKU: "k", Units: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Credit(ctx, 4, transfer.Transfer{ID: "c4", Sale: "s", SKU: "k", Units: 1})
	if !errors.Is(err, apierr.ErrFenced) {
		t.Errorf("a stale generation: %v; want FENCED", err)
	}
	bad := terms
	bad.Sale, bad.HoldTTL = "s2", 0
	if err := p.PutSale(ctx, 5, bad); !errors.Is(err, apierr.ErrInvalid) || apierr.Field(err) != "hold_ttl" {
		t.Errorf("terms without a hold TTL: %v (field %q); want INVALID_ARGUMENT on hold_ttl", err, apierr.Field(err))
	}
	if _, err := p.Credit(ctx, 5, transfer.Transfer{ID: "c6", Sale: "nope", SKU: "k", Units: 1}); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("a credit of an unknown sale: %v; want NOT_FOUND", err)
	}
	if _, _, err := dial(t, "eu", us.addr).Status(ctx, "c5"); !errors.Is(err, apierr.ErrConflict) {
		t.Errorf("a call for eu at us: %v; want CONFLICT", err)
	}
	standby := startRegion(t, "us", us.pool, false)
	_, err = dial(t, "us", standby.addr).Credit(ctx, 5, transfer.Transfer{ID: "c7", Sale: "s", SKU: "k", Units: 1})
	if !errors.Is(err, apierr.ErrNotLeader) || apierr.LeaderHint(err) != leaderAt {
		t.Errorf("a credit at a standby: %v (leader %q); want NOT_LEADER naming %s", err, apierr.LeaderHint(err), leaderAt)
	}
	follow, err := coordrpc.DialResolving("us", standby.addr, func() string { return us.addr }, insecure.NewCredentials())
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close()
	if st, err := follow.Credit(ctx, 5, transfer.Transfer{ID: "c8", Sale: "s", SKU: "k", Units: 1}); err != nil || st != transfer.InCredited {
		t.Errorf("a participant resolving to the leader: %s, %v", st, err)
	}
	if _, err := coordrpc.DialResolving("us", us.addr, nil, nil); err == nil {
		t.Error("a participant without credentials was made")
	}
}

// TestParticipantKeepsTheLeaderItResolved: a participant asks its resolver for the region's
// leader once, not before every call; a call answered NOT_LEADER (the resolver named a
// standby, as etcd does for a moment after a failover) makes the next call ask again, and it
// reaches the leader.
func TestParticipantKeepsTheLeaderItResolved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	us := newRegion(t, "us")
	standby := startRegion(t, "us", us.pool, false)
	r := &testResolver{addr: standby.addr}
	p := dialResolving(t, us.addr, r)
	terms := participantTerms()
	if err := p.PutSale(ctx, 1, terms); !errors.Is(err, apierr.ErrNotLeader) {
		t.Fatalf("a call to the standby the resolver named: %v; want NOT_LEADER", err)
	}
	r.set(us.addr)
	if err := p.PutSale(ctx, 1, terms); err != nil {
		t.Fatalf("the call after the resolver names the leader: %v", err)
	}
	for i := range 4 {
		if _, err := p.Credit(ctx, 1, transfer.Transfer{ID: fmt.Sprint("c", i), Sale: "s", SKU: "k", Units: 1}); err != nil {
			t.Fatalf("credit %d at the leader: %v", i+1, err)
		}
	}
	if asked := r.times(); asked != 3 {
		t.Errorf("the resolver was asked %d times for 6 calls; want 3 (once, again after NOT_LEADER to find another address, and for the next call)", asked)
	}
}

// testResolver names a region's leader as a test sets it, counting how often it was asked.
type testResolver struct {
	mu    sync.Mutex
	addr  string
	asked int
}

func (r *testResolver) resolve() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked++
	return r.addr
}

func (r *testResolver) set(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addr = addr
}

func (r *testResolver) times() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asked
}

// dialResolving is a participant of region us that asks r for its leader (fallback: the
// address it dials first), closed at the test's end.
func dialResolving(t *testing.T, fallback string, r *testResolver) *coordrpc.Participant {
	t.Helper()
	p, err := coordrpc.DialResolving("us", fallback, r.resolve, insecure.NewCredentials())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// participantTerms are the terms of the participant tests' sale.
func participantTerms() coordinator.SaleTerms {
	return coordinator.SaleTerms{Sale: "s", SKUs: []string{"k"}, PerUserLimit: 1, HoldTTL: time.Minute, OpensAt: time.Now()}
}

// TestParticipantForgetsALeaderThatDoesNotAnswer: the leader a participant resolved and called
// freezes (its link forwards nothing, as to a stopped process) and the standby takes over
// (the resolver names it). The call to the frozen leader ends at its deadline; the next call
// resolves the leader again and reaches the new one, rather than the address kept (for 30 s)
// that answers nothing.
func TestParticipantForgetsALeaderThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	us := newRegion(t, "us")
	frozen, err := netfault.Listen(us.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close()
	r := &testResolver{addr: frozen.Addr()}
	p := dialResolving(t, us.addr, r)
	terms := participantTerms()
	if err := p.PutSale(context.Background(), 1, terms); err != nil { // the connection is up, as a leader's is
		t.Fatalf("a call to the leader before it froze: %v", err)
	}
	frozen.Freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = p.PutSale(ctx, 1, terms)
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call to the frozen leader: %v; want DEADLINE_EXCEEDED", err)
	}
	r.set(us.addr) // the standby took over
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.PutSale(ctx, 1, terms); err != nil {
		t.Fatalf("the call after the new leader took over: %v; want it answered by the new leader", err)
	}
}
