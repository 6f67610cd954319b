package region_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// lineEnv is an env whose leader has a front door, rebuilt at each takeover.
type lineEnv struct {
	*env
	keys *admission.Keyring
	door *region.Door
}

const (
	roomSale, listSale = "room1", "list1"
	listSKU            = "wl"
	lineMaxLive        = 20
)

func newLineEnv(t *testing.T) *lineEnv {
	t.Helper()
	keys, err := admission.ParseKeyring([]byte("k1 " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32)) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	le := &lineEnv{keys: keys}
	le.env = newEnv(t, func(c *region.Config) {
		c.Cluster.Tickets = func() *admission.Keyring { return keys }
		c.Cluster.Drained = func(sale, sku string) bool { return sku == listSKU }
	})
	le.openDoor()
	return le
}

// openDoor opens a door on the leading region; the "far" buyers are bound to eu.
func (le *lineEnv) openDoor() {
	le.t.Helper()
	d, err := region.NewDoor(le.r, region.DoorConfig{Keys: func() *admission.Keyring { return le.keys }, PerUserRate: 1000, PerUserBurst: 1000,
		Bind: func(_ context.Context, _, user, here string) (string, error) {
			if len(user) > 3 && user[:3] == "far" {
				return "eu", nil
			}
			return here, nil
		}})
	if err != nil {
		le.t.Fatal(err)
	}
	le.t.Cleanup(d.Close)
	le.door = d
}

// crash stops the leader and its door and makes a new process lead: it loads everything.
func (le *lineEnv) crash() {
	le.door.Close()
	le.takeOver()
	le.openDoor()
}

// poll reads every admission, answering them by id; none may be unknown.
func (le *lineEnv) poll(sale string, ids []string) map[string]region.Admission {
	le.t.Helper()
	out := map[string]region.Admission{}
	for _, id := range ids {
		a, err := le.door.GetAdmission(le.ctx, sale, id)
		var bound interface{ Error() string }
		if err != nil && !errors.As(err, &bound) {
			le.t.Fatalf("poll %s: %v", id, err)
		}
		if err != nil && a.State != admission.Elsewhere {
			le.t.Fatalf("poll %s: %v", id, err)
		}
		out[id] = a
	}
	return out
}

// live counts the admitted, unused, unexpired admissions among as.
func live(as map[string]region.Admission) int {
	n := 0
	for _, a := range as {
		if a.State == admission.Admitted {
			n++
		}
	}
	return n
}

// waitFor polls until cond holds on the admissions, or fails after 10 s.
func (le *lineEnv) waitFor(sale string, ids []string, what string, cond func(map[string]region.Admission) bool) map[string]region.Admission {
	le.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		as := le.poll(sale, ids)
		if n := live(as); n > lineMaxLive {
			le.t.Fatalf("%d live tickets, over the cap of %d", n, lineMaxLive)
		}
		if cond(as) {
			return as
		}
		if time.Now().After(deadline) {
			le.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLineSurvivesTakeover: a leader change keeps the waiting room's line (the pre-queue's
// draw, positions, admissions with their tickets, used and elsewhere ones) and the live-ticket
// cap: every admission id is known after it, no queued buyer is further back or behind one
// who entered later, every ticket reserves, and live tickets never pass max_live_tickets.
func TestLineSurvivesTakeover(t *testing.T) {
	le := newLineEnv(t)
	terms := defaultTerms(roomSale, 1)
	terms.OpensAt = t0.Add(time.Minute)
	terms.Admission = transfer.AdmissionTerms{Rate: 1000, TicketTTL: time.Hour, MaxLive: lineMaxLive}
	le.sale(terms, 1000)
	var ids []string
	enter := func(user string) {
		a, err := le.door.Enter(le.ctx, roomSale, user, "")
		if err != nil {
			t.Fatalf("enter %s: %v", user, err)
		}
		ids = append(ids, a.ID)
	}
	for i := range 30 {
		enter(fmt.Sprintf("pre%02d", i))
	}
	enter("far-pre")
	le.clk.Advance(terms.OpensAt.Sub(le.clk.Now()))
	for i := range 30 {
		enter(fmt.Sprintf("late%02d", i))
	}
	before := le.waitFor(roomSale, ids, "the first admissions", func(as map[string]region.Admission) bool { return live(as) == lineMaxLive })
	// One ticket is used: its place goes to the next buyer.
	var used string
	for id, a := range before {
		if a.State == admission.Admitted {
			used = id
			if _, err := le.door.Reserve(le.ctx, region.ReserveRequest{Sale: roomSale, SKU: testSKU, User: a.User, Quantity: 1, RequestKey: "k-" + id,
				Ticket: a.Ticket}); err != nil {
				t.Fatalf("reserve with %s's ticket: %v", a.User, err)
			}
			break
		}
	}
	before = le.waitFor(roomSale, ids, "the used place refilled", func(as map[string]region.Admission) bool {
		return live(as) == lineMaxLive && as[used].State == admission.Used
	})
	le.crash()
	after := le.poll(roomSale, ids)
	checkLineKept(t, ids, before, after)
	// Every ticket issued before works at the new leader, and the cap holds as it admits more.
	for id, a := range before {
		if a.State != admission.Admitted {
			continue
		}
		if _, err := le.door.Reserve(le.ctx, region.ReserveRequest{Sale: roomSale, SKU: testSKU, User: a.User, Quantity: 1, RequestKey: "k-" + id,
			Ticket: a.Ticket}); err != nil {
			t.Fatalf("reserve with %s's ticket after the takeover: %v", a.User, err)
		}
	}
	if _, err := le.door.Enter(le.ctx, roomSale, before[used].User, ""); err != nil {
		t.Fatal(err)
	}
	le.waitFor(roomSale, ids, "the line to move on", func(as map[string]region.Admission) bool {
		queued := 0
		for _, a := range as {
			if a.State == admission.Queued {
				queued++
			}
		}
		return queued < 60-2*lineMaxLive
	})
}

// checkLineKept compares every admission before and after a takeover.
func checkLineKept(t *testing.T, ids []string, before, after map[string]region.Admission) {
	t.Helper()
	for _, id := range ids {
		b, a := before[id], after[id]
		switch {
		case b.State == admission.Queued && (a.State != admission.Queued || a.Position > b.Position || (b.Position > 0 && a.Position == 0)):
			t.Errorf("%s: queued at %d before, %s at %d after", b.User, b.Position, a.State, a.Position)
		case b.State == admission.Admitted && (a.State != admission.Admitted || !a.ExpiresAt.Equal(b.ExpiresAt) || a.Ticket != b.Ticket):
			t.Errorf("%s: admitted until %s before, %s until %s after", b.User, b.ExpiresAt, a.State, a.ExpiresAt)
		case b.State == admission.Used && a.State != admission.Used, b.State == admission.Elsewhere && a.State != admission.Elsewhere:
			t.Errorf("%s: %s before, %s after", b.User, b.State, a.State)
		}
	}
	// No queued buyer is behind one who was behind them.
	for _, x := range ids {
		for _, y := range ids {
			bx, by, ax, ay := before[x], before[y], after[x], after[y]
			if bx.State == admission.Queued && by.State == admission.Queued && bx.Position < by.Position && ax.Position >= ay.Position {
				t.Errorf("%s was ahead of %s (%d < %d), now behind (%d >= %d)", bx.User, by.User, bx.Position, by.Position, ax.Position, ay.Position)
			}
		}
	}
	if n := live(after); n > lineMaxLive {
		t.Errorf("%d live tickets after the takeover, cap %d", n, lineMaxLive)
	}
}

// TestWaitlistSurvivesTakeover: a leader change keeps each waitlisted buyer's turn, the
// offer out with its units set aside, and the offer's ticket. No reservation takes the
// offer's unit at the new leader, not even the first one after the takeover: a sale with a
// waiting room takes none without a ticket, and one with a ticket waits for the lines to load.
func TestWaitlistSurvivesTakeover(t *testing.T) {
	le := newLineEnv(t)
	terms := defaultTerms(listSale, 1, listSKU)
	terms.Admission = transfer.AdmissionTerms{Rate: 1000, TicketTTL: time.Hour, MaxLive: lineMaxLive}
	le.sale(terms, 1)
	a, err := le.door.Enter(le.ctx, listSale, "first", "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := le.door.Enter(le.ctx, listSale, "second", "")
	if err != nil {
		t.Fatal(err)
	}
	admitted := le.waitFor(listSale, []string{a.ID, b.ID}, "admission", func(as map[string]region.Admission) bool { return live(as) == 2 })
	first, second := admitted[a.ID], admitted[b.ID]
	res, err := le.door.Reserve(le.ctx, region.ReserveRequest{Sale: listSale, SKU: listSKU, User: "first", Quantity: 1, RequestKey: "k", Ticket: first.Ticket})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 5 {
		w, err := le.door.JoinWaitlist(le.ctx, listSale, fmt.Sprintf("w%d", i), listSKU)
		if err != nil || w.Position != i+1 {
			t.Fatalf("join the waitlist: %+v, %v", w, err)
		}
		ids = append(ids, w.ID)
	}
	if _, err := le.r.Release(le.ctx, res.Hold.ID); err != nil {
		t.Fatal(err)
	}
	before := le.waitFor(listSale, ids, "the offer", func(as map[string]region.Admission) bool { return as[ids[0]].State == admission.Admitted })
	le.crash()
	// At once, before anything loads the lines: an open buyer takes nothing set aside.
	if _, err := le.door.Reserve(le.ctx, region.ReserveRequest{Sale: listSale, SKU: listSKU, User: "second", Quantity: 1, RequestKey: "s",
		Ticket: second.Ticket}); !errors.Is(err, region.ErrRegionExhausted) {
		t.Fatalf("an open buyer's reservation at once after the takeover: %v; want the unit kept for the offer", err)
	}
	if _, err := le.door.Reserve(le.ctx, region.ReserveRequest{Sale: listSale, SKU: listSKU, User: "third", Quantity: 1, RequestKey: "t"}); !errors.Is(err, region.ErrTicketInvalid) {
		t.Fatalf("a reservation without a ticket in a sale with a waiting room: %v; want a ticket required", err)
	}
	after := le.poll(listSale, ids)
	checkLineKept(t, ids, before, after)
	if after[ids[0]].Units != 1 || after[ids[0]].SKU != listSKU {
		t.Fatalf("the offer after the takeover: %+v", after[ids[0]])
	}
	v, err := le.door.Describe(le.ctx, listSale)
	if err != nil || len(v.SKUs) != 1 || v.SKUs[0].Available != 0 {
		t.Fatalf("open buyers see %+v, %v: the offer's unit must stay set aside", v.SKUs, err)
	}
	if _, err := le.door.Reserve(le.ctx, region.ReserveRequest{Sale: listSale, SKU: listSKU, User: "w0", Quantity: 1, RequestKey: "w0",
		Ticket: after[ids[0]].Ticket}); err != nil {
		t.Fatalf("reserve with the offer after the takeover: %v", err)
	}
}
