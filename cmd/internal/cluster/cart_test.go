package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// TestCartsAllOrNothing is the carts' acceptance: 5,000 buyers, each wanting a phone and a
// case, against 1,000 phones and 600 cases at one region, over gRPC from 100 concurrent
// callers. The case sells out first: exactly 600 carts are held, no cart is held partly
// (the pools' counts and the holds' rows agree: two lines per cart, 600 of each SKU), every
// other buyer is refused naming the case, the audit is clean, and a cart retried with its
// key replays while a refused one stays refused.
func TestCartsAllOrNothing(t *testing.T) {
	d := startDev(t, "us")
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createOpenAPISale(t, coord, &quotav1.CreateSaleRequest{SaleId: "carts", PerUserLimit: 1, HoldTtlMs: time.Hour.Milliseconds(),
		Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 1000}, {Sku: "case", Total: 600}}}, map[string]int64{"us": 1})
	us := quotav1.NewRegionServiceClient(dial(t, d.Regions[0].Addr(), trust.Storefront))
	// A storefront asks again, with the same key, when told to (ABORTED: a binding write too
	// slow on a busy machine; UNAVAILABLE): at most five times.
	cart := func(buyer int) (res *quotav1.ReserveResponse, err error) {
		for range 5 {
			res, err = us.Reserve(context.Background(), &quotav1.ReserveRequest{SaleId: "carts", UserId: fmt.Sprintf("b%d", buyer), RequestKey: "cart",
				Lines: []*quotav1.CartLine{{Sku: "phone", Quantity: 1}, {Sku: "case", Quantity: 1}}})
			if c := status.Code(err); c != codes.Aborted && c != codes.Unavailable {
				return res, err
			}
			time.Sleep(100 * time.Millisecond)
		}
		return res, err
	}
	const buyers, callers = 5000, 100
	var next, held, refused atomic.Int64
	var mu sync.Mutex
	granted, other := map[int]string{}, map[string]int{}
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Minute) // about 45 s under -race on a quiet machine
	for range callers {
		wg.Go(func() {
			for b := int(next.Add(1)) - 1; b < buyers && time.Now().Before(deadline); b = int(next.Add(1)) - 1 {
				res, err := cart(b)
				code, sku := apierr.Reason(err), lineSKU(err)
				mu.Lock()
				switch {
				case err == nil && len(res.GetReservations()) == 2:
					held.Add(1)
					granted[b] = res.GetCartId()
				case (code == "REGION_EXHAUSTED" || code == "SOLD_OUT") && sku == "case":
					refused.Add(1)
				default:
					other[fmt.Sprintf("%s %s %v", code, sku, err)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d buyers: %d carts held, %d refused naming the case, others %v", buyers, held.Load(), refused.Load(), other)
	if held.Load() != 600 || refused.Load() != buyers-600 || len(other) != 0 {
		t.Fatalf("%d carts held, %d refused naming the case, other answers %v; want 600 and %d", held.Load(), refused.Load(), other, buyers-600)
	}
	checkCartStock(t, us, map[string][3]int64{"phone": {400, 600, 0}, "case": {0, 600, 0}})
	if partial := partialCarts(t, d.DBURLs["us"]); partial != 0 {
		t.Errorf("%d carts have other than two holds in the region's database", partial)
	}
	a, err := coord.Audit(context.Background(), &quotav1.AuditRequest{SaleId: "carts"})
	if err != nil || !a.GetOk() {
		t.Fatalf("audit: %v %v", a, err)
	}
	for b, id := range granted { // one granted buyer's retry: the same cart
		res, err := cart(b)
		if err != nil || !res.GetReplayed() || res.GetCartId() != id || len(res.GetReservations()) != 2 {
			t.Errorf("buyer %d's retry: %v %v; want cart %s replayed", b, res, err, id)
		}
		break
	}
	for b := range buyers { // one refused buyer's retry: refused again, nothing held
		if _, ok := granted[b]; !ok {
			if _, err := cart(b); err == nil || lineSKU(err) != "case" {
				t.Errorf("refused buyer %d's retry: %v; want refused naming the case", b, err)
			}
			break
		}
	}
	checkCartStock(t, us, map[string][3]int64{"phone": {400, 600, 0}, "case": {0, 600, 0}})
}

// lineSKU is the SKU a cart's refusal names in its ErrorInfo's metadata, or "".
func lineSKU(err error) string {
	st, _ := status.FromError(err)
	for _, det := range st.Details() {
		if info, ok := det.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()["sku"]
		}
	}
	return ""
}

// checkCartStock checks the region's pools of sale carts: available, held, sold per SKU.
func checkCartStock(t *testing.T, us quotav1.RegionServiceClient, want map[string][3]int64) {
	t.Helper()
	st, err := us.GetStock(context.Background(), &quotav1.GetStockRequest{SaleId: "carts"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.GetPools() {
		if got := [3]int64{p.GetAvailable(), p.GetHeld(), p.GetSold()}; got != want[p.GetSku()] {
			t.Errorf("pool %s: available, held, sold %v; want %v", p.GetSku(), got, want[p.GetSku()])
		}
	}
}

// partialCarts counts the carts of the region's database whose holds are not one phone and
// one case.
func partialCarts(t *testing.T, url string) (n int) {
	t.Helper()
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT cart_id FROM holds WHERE cart_id <> '' GROUP BY cart_id
		HAVING count(*) <> 2 OR count(*) FILTER (WHERE sku = 'phone') <> 1) p`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
