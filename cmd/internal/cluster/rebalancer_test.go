package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// testAuto is a quick automatic rebalancer for tests: it reads demand over 5 s and stocks
// each region for 15 s of it.
var testAuto = coordinator.AutoRebalance{Enabled: true, Every: 200 * time.Millisecond, Cooldown: 300 * time.Millisecond,
	MaxInFlight: 3, Policy: transfer.Policy{Window: 5 * time.Second, Horizon: 15 * time.Second, MinUnits: 5}}

// addAutoCoordinator starts a coordinator with the automatic rebalancer auto.
func (tc *testCluster) addAutoCoordinator(auto coordinator.AutoRebalance) *cluster.CoordinatorNode {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := cluster.StartCoordinator(ctx, cluster.CoordinatorConfig{Listen: "127.0.0.1:0", DBURL: tc.ledger, Regions: tc.eps,
		LeaseTTL: 2 * time.Second, StrandAfter: 5 * time.Second, RetryInterval: 200 * time.Millisecond, TLS: certs,
		Logger: testLogger(), Auto: auto}, tc.etcd)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(n.Close)
	tc.coords = append(tc.coords, n)
	return n
}

// autoLeader starts regions us, eu and ap and a coordinator leading them with testAuto,
// and answers an operator's client of it.
func autoLeader(t *testing.T) (*testCluster, quotav1.CoordinatorServiceClient) {
	t.Helper()
	tc := newTestCluster(t, "us", "eu", "ap")
	n := tc.addAutoCoordinator(testAuto)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	return tc, tc.coordinator(n)
}

// buyAt has one buyer after another reserve and pay for one unit at region, about every
// pace, until the region has answered SOLD_OUT, stop is closed, or d passes. It answers the
// units bought there. An unexpected answer fails the test (t.Errorf: buyAt may run on a
// goroutine of its own) and ends the buying.
func buyAt(t *testing.T, r quotav1.RegionServiceClient, sale, prefix string, pace, d time.Duration, stop <-chan struct{}) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var bought int64
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for i := 0; ; i++ {
		user := fmt.Sprintf("%s-%d", prefix, i)
		res, err := r.Reserve(ctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: user, Quantity: 1, RequestKey: "k"})
		switch {
		case err == nil:
			if _, err := r.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: res.GetReservation().GetHoldId(), PaymentId: "pay-" + user}); err != nil {
				t.Errorf("confirm %s: %v", user, err)
				return bought
			}
			bought++
		case apierr.Reason(err) == "SOLD_OUT":
			return bought
		case apierr.Reason(err) != "REGION_EXHAUSTED":
			if ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded {
				return bought
			}
			t.Errorf("reserve %s: %v", user, err)
			return bought
		}
		select {
		case <-ctx.Done():
			return bought
		case <-stop:
			return bought
		case <-tick.C:
		}
	}
}

// TestAutoRebalanceFollowsTheBuyers: every buyer of a sale allocated 40/35/25 calls one
// region; with no operator command the rebalancer moves the other regions' stock there, so
// that region alone sells at least 99.5% of the units. The plan says why it moved, a sale in
// manual mode is left alone, and the audit is clean.
func TestAutoRebalanceFollowsTheBuyers(t *testing.T) {
	tc, c := autoLeader(t)
	ctx := context.Background()
	createSale(t, c, "auto", 200, 1, time.Minute) // us 80, eu 70, ap 50
	bought := buyAt(t, tc.region("ap"), "auto", "ap-buyer", 20*time.Millisecond, 90*time.Second, nil)
	if bought < 199 {
		t.Fatalf("ap sold %d of 200 units; want at least 199 (99.5%%) with the rebalancer moving the rest to it", bought)
	}
	auto := 0
	for _, tr := range listTransfers(t, c, "auto") {
		if tr.GetFrom() != transfer.Unallocated {
			if tr.GetTo() != "ap" || tr.GetState() != "posted" {
				t.Errorf("automatic transfer %v; want posted, to ap", tr)
			}
			auto++
		}
	}
	if auto == 0 {
		t.Fatal("no automatic transfer recorded")
	}
	auditOK(t, c, "auto")
	t.Logf("ap sold %d of 200 units through %d automatic transfers", bought, auto)
	// The manual sale's buyers at ap take its 5 units at once: the plan would feed ap from
	// the other regions, but the sale's mode holds the moves back, and nothing moves.
	createManualSale(t, c, "fixed", 20) // us 8, eu 7, ap 5
	if got := buyAt(t, tc.region("ap"), "fixed", "fixed-buyer", 10*time.Millisecond, time.Second, nil); got != 5 {
		t.Fatalf("the manual sale sold %d units at ap; want its own 5", got)
	}
	plan, err := c.PlanRebalance(ctx, &quotav1.PlanRebalanceRequest{SaleId: "fixed"})
	if err != nil {
		t.Fatal(err)
	}
	if sp := plan.GetSkus()[0]; plan.GetMode() != "manual" || len(sp.GetMoves()) == 0 || !strings.Contains(sp.GetHeld(), "manual") {
		t.Fatalf("manual sale's plan %v; want moves toward ap held back by the manual mode", plan)
	}
	time.Sleep(3 * testAuto.Every)
	if n := len(listTransfers(t, c, "fixed")); n != 3 {
		t.Fatalf("the manual sale has %d transfers; want only its 3 allocations", n)
	}
}

func createManualSale(t *testing.T, c quotav1.CoordinatorServiceClient, sale string, total int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: total}},
		PerUserLimit: 1, HoldTtlMs: time.Minute.Milliseconds(), Rebalance: "manual"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale, Weights: []*quotav1.RegionWeight{
		{Region: "us", Weight: 40}, {Region: "eu", Weight: 35}, {Region: "ap", Weight: 25}}}); err != nil {
		t.Fatal(err)
	}
}

// TestAutoRebalanceSurvivesCoordinatorCrash: the coordinator leader is killed while its
// rebalancer moves stock toward the one region with buyers; the standby takes over, finishes
// what was in flight and goes on rebalancing: no transfer is applied twice (the audit
// checks every transfer against both regions' records), every transfer ends, and that
// region still sells at least 99.5% of the units.
func TestAutoRebalanceSurvivesCoordinatorCrash(t *testing.T) {
	t.Parallel() // its own cluster, no time bound (newTestCluster)
	tc := newTestCluster(t, "us", "eu", "ap")
	// Demand over 2 s stocked for 4 s: the rebalancer moves a little at a time, so it is
	// moving when the leader dies.
	auto := testAuto
	auto.Policy = transfer.Policy{Window: 2 * time.Second, Horizon: 4 * time.Second, MinUnits: 5}
	first := tc.addAutoCoordinator(auto)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := first.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	standby := tc.addAutoCoordinator(auto)
	createSale(t, tc.coordinator(first), "crash", 400, 1, time.Minute) // us 160, eu 140, ap 100
	done := make(chan int64)
	go func() { done <- buyAt(t, tc.region("ap"), "crash", "buyer", 15*time.Millisecond, 90*time.Second, nil) }()
	c := tc.coordinator(first)
	waitFor(t, "an automatic transfer", 30*time.Second, func() bool {
		for _, tr := range listTransfers(t, c, "crash") {
			if tr.GetFrom() != transfer.Unallocated {
				return true
			}
		}
		return false
	})
	first.Crash()
	if err := standby.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	bought := <-done
	c = tc.coordinator(standby)
	waitFor(t, "every transfer to end", 30*time.Second, func() bool {
		for _, tr := range listTransfers(t, c, "crash") {
			if tr.GetState() != "voided" && tr.GetState() != "posted" {
				return false
			}
		}
		return true
	})
	auditOK(t, c, "crash")
	moved, gens := 0, map[int64]int{}
	for _, tr := range listTransfers(t, c, "crash") {
		if tr.GetFrom() != transfer.Unallocated && tr.GetState() == "posted" {
			moved++
			gens[tr.GetGeneration()]++
		}
	}
	t.Logf("ap sold %d of 400 units; %d automatic transfers posted across the crash, by generation %v", bought, moved, gens)
	if bought < 398 {
		t.Fatalf("ap sold %d of 400 units; want at least 398 (99.5%%) across the coordinator's crash", bought)
	}
}

// TestAutoRebalanceFeedsADryRegion: a region allocated nothing has only refused buyers; their
// refusals count as its demand, so the rebalancer moves stock to it and they buy.
func TestAutoRebalanceFeedsADryRegion(t *testing.T) {
	tc, c := autoLeader(t)
	ctx := context.Background()
	if _, err := c.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "dry", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 100}},
		PerUserLimit: 1, HoldTtlMs: time.Minute.Milliseconds()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "dry", RequestId: "alloc-dry", Weights: []*quotav1.RegionWeight{
		{Region: "us", Weight: 50}, {Region: "eu", Weight: 50}, {Region: "ap", Weight: 0}}}); err != nil {
		t.Fatal(err)
	}
	if bought := buyAt(t, tc.region("ap"), "dry", "ap-buyer", 20*time.Millisecond, 60*time.Second, nil); bought < 99 {
		t.Fatalf("ap, allocated nothing, sold %d of 100 units; want its refused buyers to bring the stock to it", bought)
	}
	auditOK(t, c, "dry")
}
