package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// The sold-out flags follow changes, not a clock: idle sales cost the region databases no
// reads of their pools (the old loop read every sale at every region twice a second); a sale that sells
// out is flagged at once; and when the connections listening for changes are cut, the flags
// still come (every sale is read each round until the listeners are back, and they come
// back).
func TestStockFlagsFollowChanges(t *testing.T) {
	d := startDev(t, "us", "eu", "ap")
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	const idle = 30
	for i := range idle {
		createSaleAt(t, coord, fmt.Sprintf("idle%d", i), 10, "manual", "us", "eu", "ap")
	}
	createSaleAt(t, coord, "first", 2, "manual", "us")
	createSaleAt(t, coord, "second", 2, "manual", "us")
	// The creations' own changes are read, and PostgreSQL reports a connection's counts up to
	// 10 s late: wait for a quiet second (at most 20 s) before the window opens.
	quiet := false
	for deadline := time.Now().Add(20 * time.Second); !quiet && time.Now().Before(deadline); {
		before := poolReads(t, d)
		time.Sleep(time.Second)
		quiet = true
		for r, n := range poolReads(t, d) {
			quiet = quiet && n-before[r] < 5
		}
	}
	const window = 3 * time.Second
	before := poolReads(t, d)
	time.Sleep(window)
	after := poolReads(t, d)
	for r, n := range after {
		t.Logf("region %s: pools read %d times in %s", r, n-before[r], window)
		// Reading every sale every 500 ms would be 2 × 32 sales × 3 s = 192 at each region.
		if delta := n - before[r]; delta >= idle {
			t.Errorf("region %s's pools were read %d times in %s with %d idle sales; want fewer than %d", r, delta, window, idle+2, idle)
		}
	}
	us := quotav1.NewRegionServiceClient(dial(t, d.Regions[0].Addr(), trust.Storefront))
	sellOut(t, us, "first")
	start := time.Now()
	waitFor(t, "us to answer SOLD_OUT for first", 3*time.Second, func() bool { return reserveReason(us, "first") == "SOLD_OUT" })
	t.Logf("first: SOLD_OUT %s after its last unit", time.Since(start).Round(time.Millisecond))

	for name, url := range d.DBURLs {
		cut := terminateListeners(t, url)
		t.Logf("%s: cut %d listening connection(s)", name, cut)
		if cut != 1 {
			t.Errorf("%s: %d connections listening for changes, want 1", name, cut)
		}
	}
	sellOut(t, us, "second")
	waitFor(t, "us to answer SOLD_OUT for second", 5*time.Second, func() bool { return reserveReason(us, "second") == "SOLD_OUT" })
	for name, url := range d.DBURLs {
		waitFor(t, name+"'s listener to come back", 10*time.Second, func() bool { return countListeners(t, url) == 1 })
	}
}

// createSaleAt creates sale of one SKU of total units in mode and allocates all of it evenly
// over regions.
func createSaleAt(t *testing.T, coord quotav1.CoordinatorServiceClient, sale string, total int64, mode string, regions ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: total}},
		PerUserLimit: total, HoldTtlMs: time.Hour.Milliseconds(), Rebalance: mode}); err != nil {
		t.Fatal(err)
	}
	var ws []*quotav1.RegionWeight
	for _, r := range regions {
		ws = append(ws, &quotav1.RegionWeight{Region: r, Weight: 1})
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale, Weights: ws}); err != nil {
		t.Fatal(err)
	}
}

// sellOut buys and pays for sale's two units at rc.
func sellOut(t *testing.T, rc quotav1.RegionServiceClient, sale string) {
	t.Helper()
	ctx := context.Background()
	res, err := rc.Reserve(ctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "buyer", Quantity: 2, RequestKey: sale + "-buy"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: res.GetReservation().GetHoldId(), PaymentId: sale + "-pay"}); err != nil {
		t.Fatal(err)
	}
}

// reserveReason is the reason code of one more reserve of sale at rc ("" when granted).
func reserveReason(rc quotav1.RegionServiceClient, sale string) string {
	_, err := rc.Reserve(context.Background(), &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "late",
		Quantity: 1, RequestKey: fmt.Sprintf("late-%d", time.Now().UnixNano())})
	return apierr.Reason(err)
}

// poolReads is how many times each region database's pools table was scanned (by index or
// not): what the sold-out loop reads, and what neither the region's own idle work nor
// autovacuum counts.
func poolReads(t *testing.T, d *cluster.Dev) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, r := range d.Regions {
		var n int64
		if err := r.DB.QueryRow(context.Background(), `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables
			WHERE relname = 'pools'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[r.R.Name()] = n
	}
	return out
}

// listenersQuery selects the connections listening for changes at a database.
const listenersQuery = `FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'`

// terminateListeners cuts the connections listening for changes at the database at url and
// answers how many it cut.
func terminateListeners(t *testing.T, url string) (n int) {
	t.Helper()
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) `+listenersQuery).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// countListeners is how many connections listen for changes at the database at url.
func countListeners(t *testing.T, url string) (n int) {
	t.Helper()
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(context.Background(), `SELECT count(*) `+listenersQuery).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
