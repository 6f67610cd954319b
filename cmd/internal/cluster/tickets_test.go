package cluster_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// TestKeysRotateUnderARunningRegion: after the key file is rotated, a region signs new
// tickets with the new key and still accepts tickets of the old one; after a second rotation
// the oldest key's tickets are refused.
func TestKeysRotateUnderARunningRegion(t *testing.T) {
	d := startDev(t, "us")
	createWaitingSale(t, d, "rot", 100, 1000, map[string]int64{"us": 1})
	c := httpClient(t, trust.Storefront)
	us := edgeURL(d, "us")
	keyOf := func(ticket string) string {
		tk, err := admission.Peek(ticket)
		if err != nil {
			t.Fatal(err)
		}
		return tk.KeyID
	}
	rotate := func() {
		old, err := os.ReadFile(d.TicketKeys)
		if err != nil {
			t.Fatal(err)
		}
		data, err := admission.RotateKeyFile(old, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(d.TicketKeys, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	first := admit(t, c, us, "rot", "alice").str("ticket")
	oldest := admit(t, c, us, "rot", "alan").str("ticket") // of the first key too, kept unused
	rotate()
	var second string
	waitFor(t, "tickets signed with the new key", 10*time.Second, func() bool {
		second = admit(t, c, us, "rot", "bob"+itoa(int(time.Now().UnixNano()%1e6))).str("ticket")
		return second != "" && keyOf(second) != keyOf(first)
	})
	if r := reserveWith(t, c, us, "rot", first, "a1", 1); r.code != 201 {
		t.Fatalf("a ticket of the previous key, after one rotation: %d %v", r.code, r.body)
	}
	rotate()
	try := 0
	waitFor(t, "the oldest key dropped", 10*time.Second, func() bool {
		try++ // a fresh key each time: a granted one would be replayed, whatever its ticket
		return reserveWith(t, c, us, "rot", oldest, "c"+itoa(try), 1).errCode() == "TICKET_INVALID"
	})
}

// TestTicketReplaysAreRefusedAndChangeNothing: a ticket that expired, one for another sale,
// one presented for another buyer over gRPC, a forged one (also with the request key of the
// buyer it names, which must not answer that buyer's hold): each is refused with its code and
// the pool is as it was.
func TestTicketReplaysAreRefusedAndChangeNothing(t *testing.T) {
	d := startDev(t, "us")
	createWaitingSale(t, d, "rp", 100, 1000, map[string]int64{"us": 1})
	createWaitingSale(t, d, "other", 100, 1000, map[string]int64{"us": 1})
	c := httpClient(t, trust.Storefront)
	us := edgeURL(d, "us")
	data, err := os.ReadFile(d.TicketKeys)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := admission.ParseKeyring(data)
	if err != nil {
		t.Fatal(err)
	}
	real := admit(t, c, us, "rp", "erin")
	expired, err := keys.Sign(admission.Ticket{Sale: "rp", User: "erin", Region: "us", Admission: real.str("admission_id"), Expires: time.Now().Add(-time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	forged, err := mustKeyring(t).Sign(admission.Ticket{Sale: "rp", User: "erin", Region: "us", Admission: "a-forged", Expires: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	before := d.Regions[0]
	stock := func() int64 {
		resp, err := quotav1.NewRegionServiceClient(dial(t, before.Addr(), trust.Operator)).GetStock(context.Background(), &quotav1.GetStockRequest{SaleId: "rp"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetPools()[0].GetAvailable()
	}
	if r := reserveWith(t, c, us, "rp", real.str("ticket"), "erin-1", 1); r.code != http.StatusCreated {
		t.Fatalf("erin reserves with her ticket: %d %v", r.code, r.body)
	}
	had := stock()
	for _, tc := range []struct{ name, url, ticket, key string }{
		{"expired", us + "/v1/sales/rp/reservations", expired, "x-expired"},
		{"forged", us + "/v1/sales/rp/reservations", forged, "x-forged"},
		{"forged, with erin's granted request key", us + "/v1/sales/rp/reservations", forged, "erin-1"},
		{"another sale", us + "/v1/sales/other/reservations", real.str("ticket"), "x-another-sale"},
	} {
		got := call(t, c, "POST", tc.url, map[string]any{"ticket": tc.ticket, "sku": "phone", "quantity": 1, "request_key": tc.key})
		if got.code != http.StatusUnauthorized || got.errCode() != "TICKET_INVALID" {
			t.Errorf("%s: %d %v; want 401 TICKET_INVALID", tc.name, got.code, got.body)
		}
	}
	_, err = quotav1.NewRegionServiceClient(dial(t, before.Addr(), trust.Storefront)).Reserve(context.Background(), &quotav1.ReserveRequest{
		SaleId: "rp", Sku: "phone", UserId: "mallory", Quantity: 1, RequestKey: "m1", Ticket: real.str("ticket")})
	if apierr.Reason(err) != "TICKET_INVALID" {
		t.Errorf("erin's ticket presented for mallory: %v; want TICKET_INVALID", err)
	}
	if now := stock(); now != had {
		t.Fatalf("refused tickets changed the pool: %d available, had %d", now, had)
	}
}

// mustKeyring is a keyring of a key the cluster does not have.
func mustKeyring(t *testing.T) *admission.Keyring {
	t.Helper()
	data, err := admission.NewKeyFile(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := admission.ParseKeyring(data)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
