package region_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// TestSoldOutAnswer checks the answer to a reserve of an empty pool: REGION_EXHAUSTED until
// the coordinator flags the SKU gone, then SOLD_OUT naming the sale and SKU, the same error
// value for every buyer (made once per SKU), with nothing taken; and pins its cost.
func TestSoldOutAnswer(t *testing.T) {
	var flagged atomic.Bool
	e := newEnv(t, func(c *region.Config) {
		c.Cluster.SoldOut = func(sale, sku string) bool { return flagged.Load() && sale == testSale && sku == testSKU }
	})
	e.sale(defaultTerms(testSale, 1), 1)
	e.mustReserve("alice", "k1", 1)
	if _, err := e.reserve("bob", "k1", 1); !errors.Is(err, region.ErrRegionExhausted) {
		t.Fatalf("an empty pool, not flagged: %v; want REGION_EXHAUSTED", err)
	}
	flagged.Store(true)
	_, first := e.reserve("bob", "k1", 1)
	_, again := e.reserve("carol", "k9", 1)
	if !errors.Is(first, region.ErrSoldOut) || first.Error() != "sale sale1: sku1 is sold out in every region: sold out" {
		t.Fatalf("a flagged SKU: %v; want SOLD_OUT naming sale1 and sku1", first)
	}
	if again != first {
		t.Errorf("two buyers of one gone SKU got two errors: %p %p", again, first)
	}
	if res, err := e.reserve("alice", "k1", 1); err != nil || !res.Replayed {
		t.Errorf("alice's retry after the flag: %+v %v; want her hold replayed", res, err)
	}
	e.checkPool(testSale, testSKU, counts{avail: 0, held: 1})
	n := testing.AllocsPerRun(100, func() {
		if _, err := e.reserve("bob", "k1", 1); err != first {
			t.Fatalf("%v", err)
		}
	})
	if n > 0 {
		t.Errorf("a SOLD_OUT answer allocates %v times; want 0", n)
	}
}

// TestSoldOutAnswerWithTicket checks the order of a waiting-room sale's refusals of a gone
// SKU: a ticket is checked first (a tampered or foreign one is TICKET_INVALID, never
// SOLD_OUT), then the pool; a ticket read by the caller (ReserveRequest.Token) answers the
// same as its text, a Token of another text is not trusted, and the answer of a good one
// allocates nothing.
func TestSoldOutAnswerWithTicket(t *testing.T) {
	keys, err := admission.ParseKeyring([]byte("k1 " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *region.Config) {
		c.Cluster.SoldOut = func(string, string) bool { return true }
		c.Cluster.Tickets = func() *admission.Keyring { return keys }
	})
	terms := defaultTerms(testSale, 1)
	terms.Admission = transfer.AdmissionTerms{Rate: 10, TicketTTL: time.Hour, MaxLive: 10}
	e.sale(terms, 1)
	ticket := func(user string) string {
		tk, err := keys.Sign(admission.Ticket{Sale: testSale, User: user, Region: "us", Admission: "a-" + user, Expires: t0.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	reserve := func(user, tk string, tok *admission.Token) error {
		_, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: user, Quantity: 1,
			RequestKey: "k2", Ticket: tk, Token: tok})
		return err
	}
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "alice", Quantity: 1,
		RequestKey: "k1", Ticket: ticket("alice")}); err != nil {
		t.Fatalf("alice takes the last unit: %v", err)
	}
	bob := ticket("bob")
	tampered := bob[:len(bob)-2] + "AA"
	good, err := admission.ParseToken(bob)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		user    string
		ticket  string
		tok     *admission.Token
		soldOut bool
	}{
		{"a good ticket", "bob", bob, nil, true},
		{"a good ticket, read by the caller", "bob", bob, good, true},
		{"a tampered ticket", "bob", tampered, nil, false},
		{"a tampered ticket with the good one's Token", "bob", tampered, good, false},
		{"another buyer's ticket", "carol", bob, good, false},
		{"no ticket", "bob", "", nil, false},
	} {
		err := reserve(tc.user, tc.ticket, tc.tok)
		if tc.soldOut != errors.Is(err, region.ErrSoldOut) || !tc.soldOut && !errors.Is(err, region.ErrTicketInvalid) {
			t.Errorf("%s: %v; want SOLD_OUT %v, else TICKET_INVALID", tc.name, err, tc.soldOut)
		}
	}
	e.checkPool(testSale, testSKU, counts{avail: 0, held: 1})
	if raceEnabled {
		return // -race drops the keyring's pooled MACs at random: allocations are pinned without it
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := reserve("bob", bob, good); !errors.Is(err, region.ErrSoldOut) {
			t.Fatal(err)
		}
	}); n > 0 {
		t.Errorf("a SOLD_OUT answer with a read ticket allocates %v times; want 0", n)
	}
}
