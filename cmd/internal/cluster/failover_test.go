package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
)

// TestRegionFailover crashes the region leader (its lease left to expire, as after kill -9)
// while buyers reserve and pay. The standby serves within the lease TTL plus 2 s, clients
// follow it through the NOT_LEADER answer's leader address, every acknowledged hold is
// there, and the audit is clean with nothing oversold. The standby takes over from the warm
// copy of the state it kept (region.KeepWarm), not by loading every hold.
func TestRegionFailover(t *testing.T) {
	t.Parallel() // its own cluster, no time bound (newTestCluster)
	const ttl = 2 * time.Second
	e, err := fencing.StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	etcd, err := fencing.Dial([]string{e.ClientURL}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := testpg.NewDB(t, "failover")
	start := func() *cluster.RegionNode {
		n, err := cluster.StartRegion(ctx, cluster.RegionConfig{Region: region.Config{Name: "us", Verify: verify()}, Listen: "127.0.0.1:0",
			DBURL: db, LeaseTTL: ttl, TLS: certs, Logger: testLogger()}, etcd)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		return n
	}
	a := start()
	if err := a.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	b := start() // the standby: campaigns, answers NOT_LEADER with a's address
	coordNode, err := cluster.StartCoordinator(ctx, cluster.CoordinatorConfig{Listen: "127.0.0.1:0", DBURL: testpg.NewDB(t, "ledger"),
		Regions: []cluster.RegionEndpoint{{Name: "us", Addr: a.Addr(), DBURL: db}}, LeaseTTL: ttl, FollowLeaders: true, TLS: certs, Logger: testLogger()}, etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coordNode.Close)
	if err := coordNode.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	coord := quotav1.NewCoordinatorServiceClient(dial(t, coordNode.Addr(), trust.Operator))
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "f", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 40000}},
		PerUserLimit: 2, HoldTtlMs: 600000}); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "f", RequestId: "a", Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := quotav1.NewRegionServiceClient(dial(t, b.Addr(), trust.Storefront)).Reserve(ctx, &quotav1.ReserveRequest{SaleId: "f", Sku: "phone", UserId: "x",
		Quantity: 1, RequestKey: "k"}); apierr.LeaderHint(err) != a.Addr() {
		t.Fatalf("standby's answer %v; want NOT_LEADER naming %s", err, a.Addr())
	}

	done := make(chan loadgen.Stats, 1)
	go func() {
		st, err := loadgen.Run(ctx, loadgen.Config{Creds: creds(t, trust.Storefront), Sale: "f", SKU: "phone", Regions: []loadgen.Region{{Name: "us", Addr: a.Addr(), Weight: 1}},
			Buyers: 30000, Concurrency: 64, ConfirmRatio: 0.5, MaxDuration: 12 * time.Second, Seed: 9,
			Resolve: func(ctx context.Context, _ string) string {
				addr, _, _ := fencing.Leader(ctx, etcd, "region/us")
				return addr
			}})
		if err != nil {
			t.Error(err)
		}
		done <- st
	}()
	time.Sleep(3 * time.Second)
	killed := time.Now()
	a.Crash()
	waitFor(t, "the standby to lead", ttl+2*time.Second, func() bool { return b.R.Leading() })
	t.Logf("standby leads %s after the crash (lease TTL %s)", time.Since(killed).Round(time.Millisecond), ttl)
	if full, warm := b.R.Takeovers(); full != 0 || warm != 1 {
		t.Fatalf("the standby's takeovers: %d loading every hold, %d from its warm copy; want its warm copy caught up", full, warm)
	}
	st := <-done
	t.Logf("load: %d buyers, %d holds acknowledged, %d confirmed, %d failed, %d retries", st.Buyers, len(st.Holds), st.Confirmed, st.Failed, st.Retries)
	rb := quotav1.NewRegionServiceClient(dial(t, b.Addr(), trust.Storefront))
	var after int // holds created after the crash: the hold TTL is 600 s
	for id := range st.Holds {
		h, err := rb.GetReservation(ctx, &quotav1.GetReservationRequest{HoldId: id})
		if err != nil {
			t.Fatalf("acknowledged hold %s lost: %v", id, err)
		}
		if created := h.GetReservation().GetExpiresAt().AsTime().Add(-600 * time.Second); created.After(killed) {
			after++
		}
	}
	t.Logf("%d of the acknowledged holds were granted by the standby after the crash", after)
	if after == 0 {
		t.Fatal("no hold was acknowledged after the failover: the standby never served the load")
	}
	a2 := auditOK(t, coord, "f")
	if a2.GetHeld()+a2.GetSold() < int64(len(st.Holds)) || a2.GetSold() < st.Confirmed || a2.GetTotal() != 40000 {
		t.Fatalf("audit %v against %d acknowledged holds, %d confirmed", a2, len(st.Holds), st.Confirmed)
	}
}
