package cluster_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func reserveWith(t *testing.T, c *http.Client, base, sale, ticket, key string, q int) answer {
	t.Helper()
	return call(t, c, "POST", base+"/v1/sales/"+sale+"/reservations", map[string]any{"ticket": ticket, "sku": "phone", "quantity": q, "request_key": key})
}

// TestSellOutClosesTheRoomAndReturnsGoToTheWaitlist: once the last unit is taken, new
// admissions and queued buyers hear SOLD_OUT within 2 s; a unit released afterwards is
// offered to the first buyer on the waitlist, and an open buyer holding a live ticket cannot
// take it.
func TestSellOutClosesTheRoomAndReturnsGoToTheWaitlist(t *testing.T) {
	d := startDev(t, "us")
	createWaitingSale(t, d, "rush", 4, 1000, map[string]int64{"us": 1})
	c := httpClient(t, trust.Storefront)
	us := edgeURL(d, "us")

	var tickets []string
	for _, u := range []string{"a", "b", "late"} {
		a := admit(t, c, us, "rush", u)
		if a.str("ticket") == "" {
			t.Fatalf("%s not admitted: %d %v", u, a.code, a.body)
		}
		tickets = append(tickets, a.str("ticket"))
	}
	ra := reserveWith(t, c, us, "rush", tickets[0], "a1", 2)
	rb := reserveWith(t, c, us, "rush", tickets[1], "b1", 2)
	if ra.code != 201 || rb.code != 201 {
		t.Fatalf("reserves: %d %v / %d %v", ra.code, ra.body, rb.code, rb.body)
	}
	gone := time.Now()
	var heard time.Duration
	for n := 0; ; n++ {
		a := call(t, c, "POST", us+"/v1/sales/rush/admissions", map[string]string{"user_id": "newcomer" + itoa(n)})
		if a.code == http.StatusConflict && a.errCode() == "SOLD_OUT" {
			heard = time.Since(gone)
			break
		}
		if time.Since(gone) > 5*time.Second {
			t.Fatalf("no SOLD_OUT 5 s after the last unit went: %d %v", a.code, a.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("SOLD_OUT heard %s after the last unit went", heard)
	if heard > 2*time.Second {
		t.Errorf("SOLD_OUT heard %s after the last unit went; want within 2 s", heard)
	}

	w1 := call(t, c, "POST", us+"/v1/sales/rush/waitlist", map[string]string{"user_id": "w1", "sku": "phone"})
	w2 := call(t, c, "POST", us+"/v1/sales/rush/waitlist", map[string]string{"user_id": "w2", "sku": "phone"})
	if w1.code != http.StatusAccepted || w1.str("state") != "queued" || w2.code != http.StatusAccepted {
		t.Fatalf("waitlist: %d %v / %d %v", w1.code, w1.body, w2.code, w2.body)
	}
	if rel := call(t, c, "POST", us+"/v1/holds/"+ra.str("hold_id")+"/release", nil); rel.code != 200 || rel.str("state") != "released" {
		t.Fatalf("release: %d %v", rel.code, rel.body)
	}
	// The open buyer with a live ticket finds nothing: the two units are the waitlist's.
	time.Sleep(100 * time.Millisecond)
	if open := reserveWith(t, c, us, "rush", tickets[2], "late1", 1); open.code != http.StatusConflict {
		t.Fatalf("an open buyer took a returned unit: %d %v", open.code, open.body)
	}
	offer := w1
	deadline := time.Now().Add(5 * time.Second)
	for offer.str("ticket") == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		offer = call(t, c, "GET", us+"/v1/sales/rush/admissions/"+w1.str("admission_id"), nil)
	}
	if offer.str("ticket") == "" || offer.str("sku") != "phone" {
		t.Fatalf("the first waitlisted buyer got no offer: %d %v", offer.code, offer.body)
	}
	if second := call(t, c, "GET", us+"/v1/sales/rush/admissions/"+w2.str("admission_id"), nil); second.str("ticket") != "" {
		t.Fatalf("the second waitlisted buyer got an offer of units offered to the first: %v", second.body)
	}
	got := reserveWith(t, c, us, "rush", offer.str("ticket"), "w1-1", 2)
	if got.code != 201 || got.str("user_id") != "w1" {
		t.Fatalf("the waitlisted buyer could not take the offer: %d %v", got.code, got.body)
	}
	auditOK(t, quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Auditor)), "rush")
}

// TestNothingBeforeOpensAt: buyers who come before opening wait in the pre-queue with no
// ticket; after opens_at by the server's clock they are admitted, and no ticket was issued
// before it.
func TestNothingBeforeOpensAt(t *testing.T) {
	d := startDev(t, "us")
	ctx := context.Background()
	opens := time.Now().Add(2 * time.Second).Truncate(time.Millisecond)
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "later", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 100}},
		PerUserLimit: 2, HoldTtlMs: 60000, AdmitRate: 1000, TicketTtlMs: 30000, OpensAt: timestamppb.New(opens)}); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "later", RequestId: "a", Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	c := httpClient(t, trust.Storefront)
	us := edgeURL(d, "us")
	var ids []string
	for i := range 20 {
		a := call(t, c, "POST", us+"/v1/sales/later/admissions", map[string]string{"user_id": "early" + itoa(i)})
		if a.code != http.StatusAccepted || a.str("ticket") != "" {
			t.Fatalf("before opening: %d %v", a.code, a.body)
		}
		ids = append(ids, a.str("admission_id"))
	}
	for time.Now().Before(opens.Add(3 * time.Second)) {
		admitted := 0
		for _, id := range ids {
			a := call(t, c, "GET", us+"/v1/sales/later/admissions/"+id, nil)
			if a.str("ticket") == "" {
				continue
			}
			admitted++
			exp, err := time.Parse(time.RFC3339Nano, a.str("expires_at"))
			if err != nil {
				t.Fatal(err)
			}
			if issued := exp.Add(-30 * time.Second); issued.Before(opens) {
				t.Fatalf("a ticket issued at %s, before opens_at %s", issued, opens)
			}
		}
		if admitted == len(ids) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the pre-queue was not admitted within 3 s of opening")
}
