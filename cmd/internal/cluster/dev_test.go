package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"google.golang.org/grpc"
)

// startDev starts an all-in-one cluster on free ports with fresh databases.
func startDev(t *testing.T, regions ...string) *cluster.Dev {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := "quota_t_" + randHex(t)
	d, err := cluster.StartDev(ctx, cluster.DevConfig{Regions: regions, PGURL: testpg.AdminURL(), DBPrefix: prefix,
		DataDir: t.TempDir(), Host: "127.0.0.1", LeaseTTL: 2 * time.Second, Logger: testLogger(), Region: region.Config{Verify: verify()},
		CertsDir: certs.Dir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		dropDBs(t, prefix, regions)
	})
	return d
}

// dial connects to addr presenting role's certificate from the package's certificates.
func dial(t *testing.T, addr string, role trust.Role) *grpc.ClientConn {
	t.Helper()
	return testcerts.Dial(t, certs, addr, role)
}

func TestDevClusterEndToEnd(t *testing.T) {
	d := startDev(t, "us", "eu", "ap")
	ctx := context.Background()
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	_, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "s1", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 100}},
		PerUserLimit: 2, HoldTtlMs: 60000})
	if err != nil {
		t.Fatal(err)
	}
	ar, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "s1", RequestId: "alloc-1", Weights: []*quotav1.RegionWeight{
		{Region: "us", Weight: 40}, {Region: "eu", Weight: 35}, {Region: "ap", Weight: 25}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range ar.GetTransfers() {
		if tr.GetState() != "posted" {
			t.Fatalf("transfer %v not posted", tr)
		}
	}
	us := quotav1.NewRegionServiceClient(dial(t, d.Regions[0].Addr(), trust.Storefront))
	res, err := us.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s1", Sku: "phone", UserId: "u1", Quantity: 2, RequestKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := us.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: res.GetReservation().GetHoldId(), PaymentId: "p1"}); err != nil {
		t.Fatal(err)
	}
	st, err := us.GetStock(ctx, &quotav1.GetStockRequest{SaleId: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if p := st.GetPools()[0]; p.GetAvailable() != 38 || p.GetSold() != 2 {
		t.Fatalf("us pool %v; want available 38, sold 2", p)
	}
	audit, err := coord.Audit(ctx, &quotav1.AuditRequest{SaleId: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if !audit.GetOk() || audit.GetSkus()[0].GetSold() != 2 || audit.GetSkus()[0].GetAvailable() != 98 {
		t.Fatalf("audit %v", audit)
	}
}
