package region_test

import (
	"errors"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// TestPollAdmissionReadsNoDatabase: the public poll answers from memory only. With the sales
// table gone from under the region, a poll of a buyer's admission still answers as
// GetAdmission did, and a poll naming a sale the leader holds no room of is NOT_FOUND without
// a query, where GetAdmission (the storefront's, for certified callers) reads the sale's
// terms and fails.
func TestPollAdmissionReadsNoDatabase(t *testing.T) {
	le := newLineEnv(t)
	terms := defaultTerms(roomSale, 1)
	terms.Admission = transfer.AdmissionTerms{Rate: 1000, TicketTTL: time.Hour, MaxLive: lineMaxLive}
	le.sale(terms, 10)
	a, err := le.door.Enter(le.ctx, roomSale, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	// At this rate alice is admitted at once, but her binding is written in the background:
	// wait for the admission to settle, so that the poll below sees the state GetAdmission saw.
	var want region.Admission
	deadline := time.Now().Add(10 * time.Second)
	for want.State != admission.Admitted {
		if want, err = le.door.GetAdmission(le.ctx, roomSale, a.ID); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's admission did not settle: %+v", want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := le.pool.Exec(le.ctx, `ALTER TABLE sales RENAME TO sales_away`); err != nil {
		t.Fatal(err)
	}
	got, err := le.door.PollAdmission(le.ctx, roomSale, a.ID)
	if err != nil || got.ID != want.ID || got.State != want.State || got.User != "alice" {
		t.Fatalf("poll of alice's admission without the database: %+v, %v; want %+v", got, err, want)
	}
	if _, err := le.door.PollAdmission(le.ctx, "nosuch", a.ID); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("poll naming a sale without a room: %v; want NOT_FOUND from memory", err)
	}
	if _, err := le.door.GetAdmission(le.ctx, "nosuch", a.ID); err == nil || errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("GetAdmission naming an unknown sale with the sales table gone: %v; want the failed read (it reads the terms)", err)
	}
	if _, err := le.door.PollAdmission(le.ctx, roomSale, "bad id!"); fieldOf(err) != "admission_id" {
		t.Errorf("poll with a malformed id: %v; want an invalid admission_id", err)
	}
}
