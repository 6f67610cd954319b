package region_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// keyringOf is a keyring of one key, id, whose secret is 32 bytes of b.
func keyringOf(t *testing.T, id string, b byte) *admission.Keyring {
	t.Helper()
	k, err := admission.ParseKeyring([]byte(id + " " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestTicketSignatureBeforeReplay: in a waiting-room sale the ticket's signature is checked
// before a request key is replayed. A ticket that names alice but is not signed by the
// cluster (another secret under the cluster's key id, an unknown key id, a tampered MAC), no
// ticket, and bob's genuine ticket each get TICKET_INVALID with alice's request key, never
// her hold; her own ticket replays the hold, also once it has expired.
func TestTicketSignatureBeforeReplay(t *testing.T) {
	keys := keyringOf(t, "k1", 7)
	e := newEnv(t, func(c *region.Config) { c.Cluster.Tickets = func() *admission.Keyring { return keys } })
	terms := defaultTerms(testSale, 5)
	terms.Admission = transfer.AdmissionTerms{Rate: 10, TicketTTL: time.Minute, MaxLive: 10}
	e.sale(terms, 10)
	sign := func(k *admission.Keyring, user string) string {
		tk, err := k.Sign(admission.Ticket{Sale: testSale, User: user, Region: "us", Admission: "a-" + user, Expires: t0.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	reserve := func(user, ticket string) (region.ReserveResult, error) {
		return e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: user, Quantity: 1,
			RequestKey: "alice-1", Ticket: ticket})
	}
	alice := sign(keys, "alice")
	held, err := reserve("alice", alice)
	if err != nil || held.Replayed {
		t.Fatalf("alice reserves with her ticket: %+v, %v", held, err)
	}
	forged := []struct{ name, ticket string }{
		{"a ticket under the cluster's key id with another secret", sign(keyringOf(t, "k1", 9), "alice")},
		{"a ticket under an unknown key", sign(keyringOf(t, "k9", 9), "alice")},
		{"alice's ticket with its MAC changed", alice[:len(alice)-2] + "AA"},
		{"bob's genuine ticket", sign(keys, "bob")},
		{"no ticket", ""},
	}
	for _, when := range []string{"live", "expired"} {
		if when == "expired" {
			e.clk.Advance(2 * time.Minute) // every ticket has expired, alice's hold has not
		}
		for _, tc := range forged {
			if res, err := reserve("alice", tc.ticket); !errors.Is(err, region.ErrTicketInvalid) {
				t.Errorf("%s (%s) with alice's request key: %+v, %v; want TICKET_INVALID", tc.name, when, res.Hold, err)
			}
		}
	}
	again, err := reserve("alice", alice)
	if err != nil || !again.Replayed || again.Hold.ID != held.Hold.ID {
		t.Fatalf("alice's own expired ticket with her key: %+v, %v; want her hold %s replayed", again, err, held.Hold.ID)
	}
	e.checkPool(testSale, testSKU, counts{avail: 9, held: 1})
}
