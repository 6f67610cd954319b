package cluster_test

// The trust boundary, attacked as a caller on the same network would: each attack replayed
// from no certificate, a storefront's, an operator's and (for the generation) the
// coordinator's, over real gRPC and TLS against a running cluster. Every attempt is refused
// with a clear code, writes nothing (pools, fences, transfer records) and leaves the audit
// clean.

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// regionState is everything an attack could change at a region, as one comparable string
// per table.
func regionState(t *testing.T, db *pgxpool.Pool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, q := range map[string]string{
		"pools":         `SELECT coalesce(string_agg(format('%s/%s %s %s %s %s %s', sale_id, sku, available, held, sold, credited_in, debited_out), ';' ORDER BY sale_id, sku), '') FROM pools`,
		"sale_fences":   `SELECT coalesce(string_agg(format('%s %s', sale_id, generation), ';' ORDER BY sale_id), '') FROM sale_fences`,
		"transfers_in":  `SELECT count(*)::text FROM transfers_in`,
		"transfers_out": `SELECT count(*)::text FROM transfers_out`,
		"holds":         `SELECT count(*)::text FROM holds`,
		"sales":         `SELECT count(*)::text FROM sales`,
	} {
		var v string
		if err := db.QueryRow(context.Background(), q).Scan(&v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = v
	}
	return out
}

type attacker struct {
	name string
	conn func(t *testing.T, addr string) *grpc.ClientConn
}

func attackers(role ...trust.Role) []attacker {
	out := []attacker{{"no certificate", func(t *testing.T, addr string) *grpc.ClientConn { return testcerts.DialAnonymous(t, certs, addr) }}}
	for _, r := range role {
		out = append(out, attacker{"a " + string(r) + " certificate", func(t *testing.T, addr string) *grpc.ClientConn { return dial(t, addr, r) }})
	}
	return out
}

// TestAttacksAreRefused replays each attack the trust boundary must stop.
func TestAttacksAreRefused(t *testing.T) {
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, op, "s", 100) // us 50, eu 50
	dbs := map[string]*pgxpool.Pool{}
	for _, r := range []string{"us", "eu"} {
		db, err := pgutil.Open(ctx, d.DBURLs[r], 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		dbs[r] = db
	}
	before := map[string]map[string]string{"us": regionState(t, dbs["us"]), "eu": regionState(t, dbs["eu"])}
	us := d.Regions[0].Addr()
	participantAttacks := map[string]func(context.Context, quotav1.ParticipantServiceClient) error{
		"credit 1,000 units of a made-up transfer": func(ctx context.Context, p quotav1.ParticipantServiceClient) error {
			_, err := p.Credit(ctx, &quotav1.CreditRequest{Generation: 1, TransferId: "forged-1", SaleId: "s", Sku: "phone", Units: 1000})
			return err
		},
		"restore a transfer at its source": func(ctx context.Context, p quotav1.ParticipantServiceClient) error {
			_, err := p.Restore(ctx, &quotav1.RestoreRequest{Generation: 1, TransferId: "alloc-s", SaleId: "s"})
			return err
		},
		"put a sale with the highest generation": func(ctx context.Context, p quotav1.ParticipantServiceClient) error {
			_, err := p.PutSale(ctx, &quotav1.PutSaleRequest{Generation: math.MaxInt64, Sale: &quotav1.SaleTerms{SaleId: "s", Skus: []string{"phone"}, PerUserLimit: 5, HoldTtlMs: 60000}})
			return err
		},
		"refuse with units -1": func(ctx context.Context, p quotav1.ParticipantServiceClient) error {
			_, err := p.Refuse(ctx, &quotav1.RefuseRequest{Generation: 1, TransferId: "forged-2", SaleId: "s", Sku: "phone", Units: -1})
			return err
		},
		"debit to a made-up destination": func(ctx context.Context, p quotav1.ParticipantServiceClient) error {
			_, err := p.Debit(ctx, &quotav1.DebitRequest{Generation: 1, TransferId: "forged-3", SaleId: "s", Sku: "phone", To: "nowhere", Units: 50})
			return err
		},
	}
	for _, a := range attackers(trust.Storefront, trust.Operator, trust.Auditor) {
		p := quotav1.NewParticipantServiceClient(a.conn(t, us))
		for what, attack := range participantAttacks {
			wantRefused(t, a.name+": "+what, attack(ctx, p))
		}
	}
	operatorAttacks := map[string]func(context.Context, quotav1.CoordinatorServiceClient) error{
		"create a sale": func(ctx context.Context, c quotav1.CoordinatorServiceClient) error {
			_, err := c.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "mine", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 10}}, PerUserLimit: 1, HoldTtlMs: 60000})
			return err
		},
		"transfer": func(ctx context.Context, c quotav1.CoordinatorServiceClient) error {
			_, err := c.Transfer(ctx, &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "eu", Units: 10, RequestId: "steal"})
			return err
		},
		"resolve --refuse": func(ctx context.Context, c quotav1.CoordinatorServiceClient) error {
			_, err := c.ResolveTransfer(ctx, &quotav1.ResolveTransferRequest{TransferId: "alloc-s", Refuse: true})
			return err
		},
		"rebalance": func(ctx context.Context, c quotav1.CoordinatorServiceClient) error {
			_, err := c.Rebalance(ctx, &quotav1.RebalanceRequest{SaleId: "s", Sku: "phone", RequestId: "rb"})
			return err
		},
	}
	for _, a := range attackers(trust.Storefront, trust.Auditor, trust.Coordinator) {
		c := quotav1.NewCoordinatorServiceClient(a.conn(t, d.Coordinator.Addr()))
		for what, attack := range operatorAttacks {
			wantRefused(t, a.name+": "+what, attack(ctx, c))
		}
	}
	for _, r := range []string{"us", "eu"} {
		if after := regionState(t, dbs[r]); !sameState(before[r], after) {
			t.Errorf("region %s changed under attack:\nbefore %v\nafter  %v", r, before[r], after)
		}
	}
	auditOK(t, op, "s")
}

func wantRefused(t *testing.T, what string, err error) {
	t.Helper()
	switch c := status.Code(err); {
	case strings.HasPrefix(what, "no certificate") && c != codes.Unauthenticated:
		t.Errorf("%s: %v; want Unauthenticated", what, err)
	case !strings.HasPrefix(what, "no certificate") && c != codes.PermissionDenied:
		t.Errorf("%s: %v; want PermissionDenied", what, err)
	}
}

func sameState(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return len(a) == len(b)
}

// TestCoordinatorGenerationFromTheFuture: even the coordinator's certificate cannot raise a
// sale's fence above the coordinator leader's generation in etcd. The attempts are refused,
// the fence and the pools stay as they were, and the real coordinator goes on allocating to
// the region (before the bound, a later allocation stranded).
func TestCoordinatorGenerationFromTheFuture(t *testing.T) {
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, op, "s", 100)
	db, err := pgutil.Open(ctx, d.DBURLs["us"], 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	before := regionState(t, db)
	p := quotav1.NewParticipantServiceClient(dial(t, d.Regions[0].Addr(), trust.Coordinator))
	for _, gen := range []int64{math.MaxInt64, 1 << 40} {
		_, err := p.PutSale(ctx, &quotav1.PutSaleRequest{Generation: gen, Sale: &quotav1.SaleTerms{SaleId: "s", Skus: []string{"phone"}, PerUserLimit: 5, HoldTtlMs: 60000,
			OpensAt: timestamppb.Now()}})
		if status.Code(err) != codes.InvalidArgument || apierr.Field(err) != "generation" {
			t.Errorf("put sale at generation %d: %v; want InvalidArgument naming generation", gen, err)
		}
		_, err = p.Credit(ctx, &quotav1.CreditRequest{Generation: gen, TransferId: "future", SaleId: "s", Sku: "phone", Units: 1000})
		if status.Code(err) != codes.InvalidArgument || apierr.Field(err) != "generation" {
			t.Errorf("credit at generation %d: %v; want InvalidArgument naming generation", gen, err)
		}
	}
	if after := regionState(t, db); !sameState(before, after) {
		t.Errorf("the region changed:\nbefore %v\nafter  %v", before, after)
	}
	tr, err := op.Transfer(ctx, &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "eu", To: "us", Units: 10, RequestId: "after-attack"})
	if err != nil || tr.GetTransfer().GetState() != "posted" {
		t.Fatalf("the real coordinator's transfer after the attack: %v, %v; want posted", tr, err)
	}
	auditOK(t, op, "s")
}

// TestBadParticipantRequestFailsAlone: 20 invalid participant requests sent while 150
// honest reserves run: every reserve succeeds and the leader never reloads.
func TestBadParticipantRequestFailsAlone(t *testing.T) {
	d := startDev(t, "us")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	if _, err := op.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "s", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 1000}}, PerUserLimit: 2, HoldTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "s", RequestId: "a", Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	failures := d.Regions[0].R.BatchFailures()
	shop := quotav1.NewRegionServiceClient(dial(t, d.Regions[0].Addr(), trust.Storefront))
	p := quotav1.NewParticipantServiceClient(dial(t, d.Regions[0].Addr(), trust.Coordinator))
	var wg sync.WaitGroup
	errs := make(chan error, 150)
	for i := range 150 {
		wg.Go(func() {
			_, err := shop.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "u" + itoa(i), Quantity: 1, RequestKey: "k"})
			errs <- err
		})
	}
	for i := range 20 {
		wg.Go(func() {
			_, err := p.Refuse(ctx, &quotav1.RefuseRequest{Generation: 1, TransferId: "bad-" + itoa(i), SaleId: "s", Sku: "phone", Units: -1})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("refuse with units -1: %v; want InvalidArgument", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("an honest reserve failed: %v", err)
		}
	}
	if got := d.Regions[0].R.BatchFailures() - failures; got != 0 {
		t.Errorf("%d batch failures (reloads); want none", got)
	}
	if a := auditOK(t, op, "s"); a.GetHeld() != 150 {
		t.Errorf("held %d; want the 150 reserves", a.GetHeld())
	}
}

// TestForeignPauseIsReported: a misused coordinator certificate records, at the current
// generation, a resume at the highest version, which no later change of that generation can
// replace. The operator's pause is then not claimed to have reached the region: it is
// reported unreached, with the reason, and stays undelivered (retried) instead of being
// lost.
func TestForeignPauseIsReported(t *testing.T) {
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, op, "s", 100)
	gen, err := d.Coordinator.C.Generation()
	if err != nil {
		t.Fatal(err)
	}
	p := quotav1.NewParticipantServiceClient(dial(t, d.Regions[0].Addr(), trust.Coordinator))
	if _, err := p.SetPaused(ctx, &quotav1.SetPausedRequest{Generation: gen, SaleId: "s", Paused: false, Reason: "foreign", Version: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	resp, err := op.PauseSale(ctx, &quotav1.PauseSaleRequest{SaleId: "s", Reason: "fraud"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetUnreached()) != 1 || resp.GetUnreached()[0].GetRegion() != "us" || !strings.Contains(resp.GetUnreached()[0].GetError(), "not made by this coordinator") {
		t.Fatalf("pause over a foreign record at us: reached %v, unreached %v; want us reported unreached, naming why", resp.GetReached(), resp.GetUnreached())
	}
	if ps := resp.GetSale().GetPauses(); len(ps) != 1 || strings.Join(ps[0].GetUndelivered(), ",") != "us" {
		t.Fatalf("the sale's pauses: %v; want the pause undelivered at us", ps)
	}
}

// TestHostileTextAndTimesAreRefused: a pause reason with control characters (it is shown to
// buyers and written to logs) and a sale's terms without a valid opens_at (it would open the
// sale at once) are refused naming the field, and change nothing.
func TestHostileTextAndTimesAreRefused(t *testing.T) {
	d := startDev(t, "us")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	if _, err := op.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "s", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 10}}, PerUserLimit: 1, HoldTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	for _, reason := range []string{"a\x00b", "\x1b[31mRED\x1b[0m\nfake log line"} {
		_, err := op.PauseSale(ctx, &quotav1.PauseSaleRequest{SaleId: "s", Reason: reason})
		if status.Code(err) != codes.InvalidArgument || apierr.Field(err) != "reason" {
			t.Errorf("pause with reason %q: %v; want InvalidArgument naming reason", reason, err)
		}
	}
	if g, err := op.GetSale(ctx, &quotav1.GetSaleRequest{SaleId: "s"}); err != nil || len(g.GetSale().GetPauses()) != 0 {
		t.Errorf("after the refused pauses: %v, %v; want no pause", g, err)
	}
	gen, err := d.Coordinator.C.Generation()
	if err != nil {
		t.Fatal(err)
	}
	p := quotav1.NewParticipantServiceClient(dial(t, d.Regions[0].Addr(), trust.Coordinator))
	for _, opens := range []*timestamppb.Timestamp{nil, {Seconds: math.MaxInt64}} {
		_, err := p.PutSale(ctx, &quotav1.PutSaleRequest{Generation: gen, Sale: &quotav1.SaleTerms{SaleId: "t", Skus: []string{"phone"}, PerUserLimit: 1, HoldTtlMs: 60000, OpensAt: opens}})
		if status.Code(err) != codes.InvalidArgument || apierr.Field(err) != "opens_at" {
			t.Errorf("put sale with opens_at %v: %v; want InvalidArgument naming opens_at", opens, err)
		}
	}
}
