package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func leader(t *testing.T, tc *testCluster) quotav1.CoordinatorServiceClient {
	t.Helper()
	n := tc.addCoordinator(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	return tc.coordinator(n)
}

func listTransfers(t *testing.T, c quotav1.CoordinatorServiceClient, sale string) []*quotav1.TransferInfo {
	t.Helper()
	l, err := c.ListTransfers(context.Background(), &quotav1.ListTransfersRequest{SaleId: sale})
	if err != nil {
		t.Fatal(err)
	}
	return l.GetTransfers()
}

// TestTransferBetweenRegions moves units us → eu, replays it, and refuses bad input without
// changing anything.
func TestTransferBetweenRegions(t *testing.T) {
	tc := newTestCluster(t, "us", "eu", "ap")
	c := leader(t, tc)
	ctx := context.Background()
	createSale(t, c, "s", 1000, 5, time.Minute) // us 400, eu 350, ap 250
	req := &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "eu", Units: 300, RequestId: "move-1"}
	r, err := c.Transfer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if r.GetTransfer().GetState() != "posted" || r.GetTransfer().GetGeneration() <= 0 {
		t.Fatalf("transfer %v; want posted with a generation", r.GetTransfer())
	}
	again, err := c.Transfer(ctx, req)
	if err != nil || !again.GetReplayed() || again.GetTransfer().GetTransferId() != r.GetTransfer().GetTransferId() {
		t.Fatalf("replay: %v, %v", again, err)
	}
	if us, eu := tc.stock("us", "s"), tc.stock("eu", "s"); us.GetAvailable() != 100 || us.GetDebitedOut() != 300 ||
		eu.GetAvailable() != 650 || eu.GetCreditedIn() != 650 {
		t.Fatalf("after the transfer us %v, eu %v", us, eu)
	}
	before := len(listTransfers(t, c, "s"))
	bad := []struct {
		name string
		req  *quotav1.TransferRequest
		code codes.Code
	}{
		{"zero units", &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "eu", Units: 0, RequestId: "b1"}, codes.InvalidArgument},
		{"negative units", &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "eu", Units: -5, RequestId: "b2"}, codes.InvalidArgument},
		{"from = to", &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "us", Units: 1, RequestId: "b3"}, codes.InvalidArgument},
		{"unknown region", &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "mars", Units: 1, RequestId: "b4"}, codes.InvalidArgument},
		{"unknown sku", &quotav1.TransferRequest{SaleId: "s", Sku: "tablet", From: "us", To: "eu", Units: 1, RequestId: "b5"}, codes.NotFound},
		{"more than the source has", &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "eu", Units: 101, RequestId: "b6"}, codes.InvalidArgument},
		{"id reused with other content", &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "eu", Units: 1, RequestId: "move-1"}, codes.AlreadyExists},
	}
	for _, b := range bad {
		if _, err := c.Transfer(ctx, b.req); status.Code(err) != b.code || apierr.Reason(err) == "" {
			t.Errorf("%s: %v; want %s with a reason", b.name, err, b.code)
		}
	}
	if after := len(listTransfers(t, c, "s")); after != before {
		t.Fatalf("bad requests recorded transfers: %d → %d", before, after)
	}
	if us := tc.stock("us", "s"); us.GetAvailable() != 100 {
		t.Fatalf("bad requests changed us: %v", us)
	}
	a := auditOK(t, c, "s")
	if a.GetInFlight() != 0 || a.GetAvailable() != 1000 {
		t.Fatalf("audit %v", a)
	}
}

// TestUnreachableDestinationStrandsThenResolves cuts the coordinator off from the
// destination during the credit: the units stay in flight, are flagged stranded, nobody can
// sell them, and once the destination is back, resolve posts the transfer exactly once.
func TestUnreachableDestinationStrandsThenResolves(t *testing.T) {
	tc := newTestCluster(t, "us", "eu", "ap")
	c := leader(t, tc)
	ctx := context.Background()
	createSale(t, c, "s", 1000, 1000, time.Minute) // us 400, eu 350, ap 250
	tc.proxies["eu"].Cut()
	r, err := c.Transfer(ctx, &quotav1.TransferRequest{SaleId: "s", Sku: "phone", From: "us", To: "eu", Units: 200, RequestId: "cut-1"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetTransfer().GetTransferId()
	if r.GetTransfer().GetState() != "pending" {
		t.Fatalf("transfer to an unreachable region: %v; want pending", r.GetTransfer())
	}
	waitFor(t, "the transfer to be flagged stranded", 15*time.Second, func() bool {
		g, err := c.GetTransfer(ctx, &quotav1.GetTransferRequest{TransferId: id})
		return err == nil && g.GetTransfer().GetStranded() && g.GetTransfer().GetReason() != ""
	})
	a := auditOK(t, c, "s")
	if a.GetInFlight() != 200 || a.GetStranded() != 200 {
		t.Fatalf("audit in flight %d, stranded %d; want 200 and 200", a.GetInFlight(), a.GetStranded())
	}
	// The source sells only what it has left; the stranded units are nowhere to be sold.
	us, eu := tc.region("us"), tc.region("eu")
	granted := 0
	for i := 0; i < 250; i++ {
		if _, err := us.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "u", Quantity: 1, RequestKey: "k" + itoa(i)}); err == nil {
			granted++
		}
	}
	if granted != 200 {
		t.Fatalf("us granted %d after sending 200 of 400 away; want 200", granted)
	}
	if p := tc.stock("eu", "s"); p.GetAvailable() != 350 {
		t.Fatalf("eu has %d available while the credit is cut; want 350", p.GetAvailable())
	}
	if _, err := eu.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "v", Quantity: 351, RequestKey: "x"}); err == nil {
		t.Fatal("eu sold more than its own pool")
	}
	// Resolve fails, changing nothing, while the destination does not answer.
	if res, err := c.ResolveTransfer(ctx, &quotav1.ResolveTransferRequest{TransferId: id}); err != nil || res.GetTransfer().GetState() != "pending" {
		t.Fatalf("resolve while cut: %v, %v; want still pending", res, err)
	}
	tc.proxies["eu"].Heal()
	resolveUntil(t, c, id, false, "posted")
	if _, err := c.ResolveTransfer(ctx, &quotav1.ResolveTransferRequest{TransferId: id}); err != nil {
		t.Fatal(err)
	}
	if p := tc.stock("eu", "s"); p.GetCreditedIn() != 550 || p.GetAvailable() != 550 {
		t.Fatalf("eu after resolve: %v; want credited once (550)", p)
	}
	a = auditOK(t, c, "s")
	if a.GetInFlight() != 0 || a.GetStranded() != 0 || a.GetHeld() != 200 {
		t.Fatalf("final audit %v", a)
	}
}

// TestRefuseThenCreditIsRefused: resolve --refuse while the destination is cut changes
// nothing (no restore before the destination's durable refusal); once it answers, it
// tombstones the transfer, the source is restored, and a late credit is refused.
func TestRefuseThenCreditIsRefused(t *testing.T) {
	tc := newTestCluster(t, "us", "eu")
	c := leader(t, tc)
	ctx := context.Background()
	if _, err := c.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "s", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 100}},
		PerUserLimit: 1, HoldTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "s", RequestId: "a", Weights: []*quotav1.RegionWeight{
		{Region: "us", Weight: 1}, {Region: "eu", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	// From here on one coordinator drives, and only when asked: no background retry of the
	// credit races the operator's refusal.
	tc.coords[0].Close()
	op := tc.rawCoordinator(t, 1<<30, nil, nil)
	tc.proxies["eu"].Cut()
	tr, _, err := op.Transfer(ctx, coordinator.TransferRequest{Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 30, RequestID: "r-1"})
	if err != nil || tr.State != transfer.Pending {
		t.Fatalf("%+v, %v", tr, err)
	}
	if got, err := op.Resolve(ctx, tr.ID, true); err != nil || got.State != transfer.Pending {
		t.Fatalf("refuse while cut: %+v, %v", got, err)
	}
	if us := tc.stock("us", "s"); us.GetAvailable() != 20 {
		t.Fatalf("us restored before the destination refused: %v", us)
	}
	tc.proxies["eu"].Heal()
	waitFor(t, "the refusal to void the transfer", 20*time.Second, func() bool {
		got, err := op.Resolve(ctx, tr.ID, true)
		return err == nil && got.State == transfer.Voided
	})
	if us, eu := tc.stock("us", "s"), tc.stock("eu", "s"); us.GetAvailable() != 50 || eu.GetAvailable() != 50 {
		t.Fatalf("after the refusal us %v eu %v; want 50 and 50", us, eu)
	}
	// A late credit of the refused transfer (a zombie's retry) is refused and adds nothing.
	st, err := tc.regions["eu"].R.Credit(ctx, region.CreditRequest{Generation: 1 << 30, TransferID: tr.ID, Sale: "s", SKU: "phone", Units: 30})
	if err != nil || st != "refused" {
		t.Fatalf("credit after refuse: %v, %v; want refused", st, err)
	}
	if eu := tc.stock("eu", "s"); eu.GetAvailable() != 50 {
		t.Fatalf("late credit changed eu: %v", eu)
	}
	mustAudit(t, op, "s", "after the refusal")
}

// resolveUntil resolves a transfer as an operator would, again while the destination's
// connection is still coming back, until it reaches want.
func resolveUntil(t *testing.T, c quotav1.CoordinatorServiceClient, id string, refuse bool, want string) {
	t.Helper()
	var last *quotav1.ResolveTransferResponse
	var err error
	waitFor(t, "resolve to reach "+want, 20*time.Second, func() bool {
		last, err = c.ResolveTransfer(context.Background(), &quotav1.ResolveTransferRequest{TransferId: id, Refuse: refuse})
		return err == nil && last.GetTransfer().GetState() == want && !last.GetTransfer().GetStranded()
	})
}

// TestRegionDownAtSaleCreationLearnsTheTerms: a region unreachable when a sale is created,
// and given none of its stock, does not know the sale (NOT_FOUND); once it is back, the
// coordinator's driver delivers the terms, and the region tells buyers to look elsewhere
// (REGION_EXHAUSTED) without waiting for a credit.
func TestRegionDownAtSaleCreationLearnsTheTerms(t *testing.T) {
	tc := newTestCluster(t, "us", "eu")
	c := leader(t, tc)
	ctx := context.Background()
	tc.proxies["eu"].Cut()
	if _, err := c.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "s", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 100}},
		PerUserLimit: 1, HoldTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "s", RequestId: "alloc-s",
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	eu := tc.region("eu") // the node itself, not the coordinator's cut path to it
	reserve := func() error {
		_, err := eu.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "u", Quantity: 1, RequestKey: "k"})
		return err
	}
	if err := reserve(); apierr.Reason(err) != "NOT_FOUND" {
		t.Fatalf("eu before it heard of the sale: %v; want NOT_FOUND", err)
	}
	tc.proxies["eu"].Heal()
	waitFor(t, "eu to learn the sale's terms", 15*time.Second, func() bool {
		return apierr.Reason(reserve()) == "REGION_EXHAUSTED"
	})
	if p := tc.stock("us", "s"); p.GetAvailable() != 100 {
		t.Fatalf("us has %d available; want the whole 100", p.GetAvailable())
	}
}

// TestRegionAddedLaterLearnsTheTerms: a sale created while the coordinator knew only us; a
// coordinator configured with us and eu takes over, and eu learns the sale's terms (answers
// REGION_EXHAUSTED, not NOT_FOUND) without a transfer ever reaching it.
func TestRegionAddedLaterLearnsTheTerms(t *testing.T) {
	tc := newTestCluster(t, "us", "eu")
	both := tc.eps
	tc.eps = both[:1] // the first coordinator knows us only
	first := tc.addCoordinator(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := first.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.coordinator(first).CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "s",
		Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 10}}, PerUserLimit: 1, HoldTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	eu := tc.region("eu")
	reserve := func() error {
		_, err := eu.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "u", Quantity: 1, RequestKey: "k"})
		return err
	}
	time.Sleep(500 * time.Millisecond) // the first coordinator's terms loop has run: eu is not its region
	if err := reserve(); apierr.Reason(err) != "NOT_FOUND" {
		t.Fatalf("eu, unknown to the first coordinator: %v; want NOT_FOUND", err)
	}
	first.Close() // resigns
	tc.eps = both
	second := tc.addCoordinator(time.Second)
	if err := second.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "eu to learn the sale's terms from the new leader", 15*time.Second, func() bool {
		return apierr.Reason(reserve()) == "REGION_EXHAUSTED"
	})
}
