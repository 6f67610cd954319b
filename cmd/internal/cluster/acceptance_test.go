package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// createSale creates a sale of one SKU and allocates it us=40, eu=35, ap=25.
func createSale(t *testing.T, coord quotav1.CoordinatorServiceClient, sale string, total, limit int64, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: total}},
		PerUserLimit: limit, HoldTtlMs: ttl.Milliseconds()}); err != nil {
		t.Fatal(err)
	}
	ar, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale, Weights: []*quotav1.RegionWeight{
		{Region: "us", Weight: 40}, {Region: "eu", Weight: 35}, {Region: "ap", Weight: 25}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range ar.GetTransfers() {
		if tr.GetState() != "posted" {
			t.Fatalf("allocation transfer %v not posted", tr)
		}
	}
}

func auditOK(t *testing.T, coord quotav1.CoordinatorServiceClient, sale string) *quotav1.SkuAudit {
	t.Helper()
	a, err := coord.Audit(context.Background(), &quotav1.AuditRequest{SaleId: sale})
	if err != nil {
		t.Fatal(err)
	}
	if !a.GetOk() || len(a.GetSkus()) != 1 {
		t.Fatalf("audit not ok: %v", a)
	}
	return a.GetSkus()[0]
}

// TestFlashSaleNoOversell is the foundation's headline promise: 10,000 units, 50,000
// Reserve calls over gRPC from 1,000 concurrent callers spread (skewed) over three regions:
// exactly 10,000 units end up held or sold, none oversold, and the audit is clean.
func TestFlashSaleNoOversell(t *testing.T) {
	d := startDev(t, "us", "eu", "ap")
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale(t, coord, "flash", 10000, 2, 10*time.Minute)
	var regions []loadgen.Region
	for i, w := range []int64{60, 25, 15} {
		regions = append(regions, loadgen.Region{Name: d.Regions[i].R.Name(), Addr: d.Regions[i].Addr(), Weight: w})
	}
	buyers := 50000
	st, err := loadgen.Run(context.Background(), loadgen.Config{Creds: creds(t, trust.Storefront), Sale: "flash", SKU: "phone", Regions: regions, Buyers: buyers,
		Concurrency: 1000, ConfirmRatio: 1, MaxDuration: 8 * time.Minute, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d buyers in %s: %d granted, %d exhausted, %d failed (first: %q), %d retries", st.Buyers, st.Elapsed, st.Granted, st.Exhausted, st.Failed, st.FirstError, st.Retries)
	if st.Buyers != int64(buyers) {
		t.Fatalf("only %d of %d buyers ran (time bound hit)", st.Buyers, buyers)
	}
	if st.UnitsGranted != 10000 || st.Granted+st.Exhausted+st.SoldOut != int64(buyers) || st.Failed != 0 {
		t.Fatalf("granted %d units to %d buyers, %d exhausted, %d sold out, %d failed; want exactly 10000 units and every other buyer refused",
			st.UnitsGranted, st.Granted, st.Exhausted, st.SoldOut, st.Failed)
	}
	a := auditOK(t, coord, "flash")
	if a.GetHeld()+a.GetSold() != 10000 || a.GetAvailable() != 0 || a.GetSold() != st.Confirmed {
		t.Fatalf("audit held %d + sold %d, available %d; confirmed %d", a.GetHeld(), a.GetSold(), a.GetAvailable(), st.Confirmed)
	}
	// Every unit sold (all buyers paid): every region now says SOLD_OUT, not REGION_EXHAUSTED.
	for _, r := range d.Regions {
		rc := quotav1.NewRegionServiceClient(dial(t, r.Addr(), trust.Storefront))
		waitFor(t, "region "+r.R.Name()+" to answer SOLD_OUT", 10*time.Second, func() bool {
			_, err := rc.Reserve(context.Background(), &quotav1.ReserveRequest{SaleId: "flash", Sku: "phone", UserId: "late",
				Quantity: 1, RequestKey: "late-1"})
			return apierr.Reason(err) == "SOLD_OUT"
		})
	}
}
