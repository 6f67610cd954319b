package admission

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// recorder keeps what a caller of Arrive and Settle records of a room, as Stored entries in
// the order they were recorded, and the states it writes (admitted, elsewhere).
type recorder struct {
	order []string
	rows  map[string]*Stored
}

func newRecorder() *recorder { return &recorder{rows: map[string]*Stored{}} }

func (rc *recorder) enter(t *testing.T, r *Room, user string, now time.Time) Entry {
	t.Helper()
	e, a, err := r.Arrive(user, now)
	if err != nil {
		t.Fatalf("Arrive(%s): %v", user, err)
	}
	if a == nil {
		return e
	}
	rc.order = append(rc.order, a.ID)
	rc.rows[a.ID] = &Stored{ID: a.ID, User: user, Pre: a.Pre, State: Queued}
	return r.Settle(a, true, now)
}

func (rc *recorder) stored() []Stored {
	out := make([]Stored, 0, len(rc.order))
	for _, id := range rc.order {
		out = append(out, *rc.rows[id])
	}
	return out
}

// TestRestoreKeepsPlacesAdmissionsAndCap: a room restored from what was recorded of another
// (a leader taking over) shows every queued buyer at the same position, the pre-queue drawn
// the same, admitted buyers admitted with their expiry, used and elsewhere ones ended, and
// counts the live tickets against MaxLive.
func TestRestoreKeepsPlacesAdmissionsAndCap(t *testing.T) {
	cfg := func(c *RoomConfig) { c.Rate, c.MaxLive = 1000, 30 }
	old, rc := newRoom(t, cfg), newRecorder()
	for i := range 40 {
		rc.enter(t, old, fmt.Sprintf("early%02d", i), opens.Add(-30*time.Second))
	}
	now := opens.Add(time.Second)
	for i := range 40 {
		rc.enter(t, old, fmt.Sprintf("late%02d", i), now)
	}
	picked := old.Due(now, 25)
	for i, e := range picked {
		switch {
		case i < 20:
			exp := now.Add(time.Minute)
			if _, err := old.Admit(e.ID, exp); err != nil {
				t.Fatal(err)
			}
			rc.rows[e.ID].State, rc.rows[e.ID].ExpiresAt = Admitted, exp
		case i < 22:
			if _, err := old.Elsewhere(e.ID, "ap"); err != nil {
				t.Fatal(err)
			}
			rc.rows[e.ID].State, rc.rows[e.ID].Region = Elsewhere, "ap"
		} // the rest stay Binding: not recorded, queued again at the front after a takeover
	}
	old.Used(picked[0].ID)
	rc.rows[picked[0].ID].State = Used // a hold records it
	later := now.Add(10 * time.Millisecond)
	restored := newRoom(t, cfg)
	if err := restored.Restore(rc.stored(), later); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	for _, id := range rc.order {
		was, _ := old.Get(id, later)
		got, ok := restored.Get(id, later)
		if was.State == Binding { // a binding not yet recorded starts again, at the front
			was.State, was.Position = Queued, len(picked)-22
		}
		if !ok || got.State != was.State || got.Position > was.Position || got.ExpiresAt != was.ExpiresAt {
			t.Fatalf("entry %s (%s) restored as %+v, %v; was %+v", id, was.User, got, ok, was)
		}
	}
	s := restored.Stats(later)
	if s.Live != 19 || s.Used != 1 || s.Elsewhere != 2 || s.Queued != 80-22 {
		t.Fatalf("restored stats %+v", s)
	}
	// The cap counts the restored tickets: 30 - 19 more at most.
	var due []Entry
	for at := later; at.Before(later.Add(time.Second)); at = at.Add(10 * time.Millisecond) {
		due = append(due, restored.Due(at, 1000)...)
	}
	if len(due) != 11 {
		t.Fatalf("restored room picked %d, want 11 under a cap of 30 with 19 live", len(due))
	}
	if err := restored.Restore(nil, later); !errors.Is(err, apierr.ErrConflict) {
		t.Fatalf("restoring a room with entries: %v", err)
	}
}

// TestRestoreBeforeOpeningDrawsTheSame: a pre-queue restored before opens_at is drawn at
// opening exactly as the old room drew it.
func TestRestoreBeforeOpeningDrawsTheSame(t *testing.T) {
	old, rc := newRoom(t, nil), newRecorder()
	for i := range 50 {
		rc.enter(t, old, fmt.Sprintf("u%02d", 49-i), opens.Add(-time.Minute+time.Duration(i)*time.Millisecond))
	}
	restored := newRoom(t, nil)
	if err := restored.Restore(rc.stored(), opens.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, id := range rc.order {
		a, _ := old.Get(id, opens)
		b, _ := restored.Get(id, opens)
		if a.Position == 0 || a.Position != b.Position {
			t.Fatalf("entry %s drawn at %d, restored at %d", id, a.Position, b.Position)
		}
	}
}

// TestDrawWaitsForPreQueueArrivals: a pre-queue arrival still being recorded at opens_at
// holds the draw up, so the draw is of every pre-queue arrival; one after opens_at settles
// behind the drawn pre-queue.
func TestDrawWaitsForPreQueueArrivals(t *testing.T) {
	r := newRoom(t, nil)
	mustEnter(t, r, "a", opens.Add(-time.Second))
	_, pending, err := r.Arrive("b", opens.Add(-time.Millisecond))
	if err != nil || pending == nil || !pending.Pre {
		t.Fatalf("Arrive before opening: %+v, %v", pending, err)
	}
	if got := r.Due(opens, 10); len(got) != 0 {
		t.Fatalf("picked %v while a pre-queue arrival was being recorded", got)
	}
	_, late, err := r.Arrive("c", opens)
	if err != nil || late.Pre {
		t.Fatalf("Arrive after opens_at: %+v, %v", late, err)
	}
	if e := r.Settle(late, true, opens); e.Position != 0 || e.State != Queued {
		t.Fatalf("settled after opens_at before the draw: %+v", e)
	}
	b := r.Settle(pending, true, opens)
	c, _ := r.Get(late.ID, opens)
	if b.Position < 1 || b.Position > 2 || c.Position != 3 {
		t.Fatalf("after the draw: b at %d, c at %d; want b drawn in 1..2, c at 3", b.Position, c.Position)
	}
}

// TestSettleFailedLetsThePlaceGo: an arrival not recorded leaves nothing, counts against
// MaxQueue only while kept, and a second Arrive of the same buyer meanwhile is ABORTED.
func TestSettleFailedLetsThePlaceGo(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.MaxQueue = 1 })
	_, a, err := r.Arrive("x", opens)
	if err != nil || a == nil {
		t.Fatal(err)
	}
	if _, _, err := r.Arrive("x", opens); !errors.Is(err, apierr.ErrAborted) {
		t.Fatalf("second Arrive while kept: %v", err)
	}
	var over *apierr.OverloadedError
	if _, _, err := r.Arrive("y", opens); !errors.As(err, &over) {
		t.Fatalf("Arrive past MaxQueue with one kept: %v", err)
	}
	if e := r.Settle(a, false, opens); e.ID != "" {
		t.Fatalf("failed settle answered %+v", e)
	}
	if _, ok := r.Get(a.ID, opens); ok {
		t.Fatal("a failed arrival is in the room")
	}
	if s := r.Stats(opens); s.Entries != 0 || s.Queued != 0 {
		t.Fatalf("stats after a failed arrival: %+v", s)
	}
	mustEnter(t, r, "y", opens)
}

// TestWaitlistPlanRestore: planned offers are the offers made, and a restored waitlist keeps
// every buyer's turn and the units its offers set aside.
func TestWaitlistPlanRestore(t *testing.T) {
	w := newWaitlist(t, nil)
	var stored []Stored
	for i := range 10 {
		e, a, err := w.Arrive(fmt.Sprintf("w%d", i), opens)
		if err != nil || a == nil {
			t.Fatal(e, err)
		}
		w.Settle(a, true, opens)
		stored = append(stored, Stored{ID: a.ID, User: a.User, State: Queued})
	}
	plan := w.PlanOffers(5, 2, opens)
	if got := w.Offer(5, 2, opens); !slices.Equal(plan, got) || len(got) != 3 {
		t.Fatalf("planned %v, offered %v", plan, got)
	}
	for i, o := range plan {
		stored[i].State, stored[i].Units, stored[i].ExpiresAt = Admitted, o.Units, o.Expires
	}
	w.Claimed(plan[0].ID, 2)
	stored[0].State = Used
	now := opens.Add(time.Second)
	restored := newWaitlist(t, nil)
	if err := restored.Restore(stored, now); err != nil {
		t.Fatal(err)
	}
	if a, b := w.SetAside(), restored.SetAside(); a != 3 || b != 3 {
		t.Fatalf("set aside %d, restored %d; want 3", a, b)
	}
	for _, s := range stored {
		a, _ := w.Get(s.ID, now)
		b, ok := restored.Get(s.ID, now)
		if !ok || a.State != b.State || a.Position != b.Position || a.Units != b.Units {
			t.Fatalf("waitlist entry %s was %+v, restored %+v", s.ID, a, b)
		}
	}
	if err := restored.Restore(stored, now); !errors.Is(err, apierr.ErrConflict) {
		t.Fatalf("restoring twice: %v", err)
	}
}

// TestRestoreRefusesBadEntries names the field of a stored entry that cannot be restored.
func TestRestoreRefusesBadEntries(t *testing.T) {
	for _, s := range []Stored{{User: "u", State: Queued}, {ID: "a", State: Queued}, {ID: "a", User: "u", State: Admitted},
		{ID: "a", User: "u", State: Binding}, {ID: "a", User: "u", State: "odd"}} {
		if err := newRoom(t, nil).Restore([]Stored{s}, opens); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("Restore(%+v) = %v, want INVALID_ARGUMENT", s, err)
		}
	}
}

// TestRestoreKeepsLastEntryPerUser: a buyer with two rows not final (a queued or admitted one
// and a later one) keeps only the later: the earlier neither holds a live place against
// MaxLive nor waits to be admitted, and in a waitlist an earlier offer sets nothing aside.
func TestRestoreKeepsLastEntryPerUser(t *testing.T) {
	later := opens.Add(time.Second)
	r := newRoom(t, func(c *RoomConfig) { c.MaxLive = 1 })
	stored := []Stored{
		{ID: "a1", User: "ann", State: Admitted, ExpiresAt: opens.Add(time.Hour)},
		{ID: "b1", User: "bob", State: Queued},
		{ID: "a2", User: "ann", State: Queued},
		{ID: "b2", User: "bob", State: Queued},
	}
	if err := r.Restore(stored, later); err != nil {
		t.Fatal(err)
	}
	if s := r.Stats(later); s.Live != 0 || s.Queued != 2 {
		t.Fatalf("restored stats %+v; want no live ticket and 2 queued (one per buyer)", s)
	}
	if e, _ := r.Lookup("ann", later); e.ID != "a2" || e.State != Queued || e.Position != 1 {
		t.Fatalf("ann's entry %+v; want a2 first in line", e)
	}
	if e, _ := r.Get("a1", later); e.State != Expired {
		t.Fatalf("ann's earlier entry %+v; want it ended", e)
	}
	if due := r.Due(later, 10); len(due) != 1 || due[0].ID != "a2" {
		t.Fatalf("due %v; want a2 alone (MaxLive 1)", ids(due))
	}

	w := newWaitlist(t, nil)
	if err := w.Restore([]Stored{
		{ID: "o1", User: "ann", State: Admitted, Units: 2, ExpiresAt: opens.Add(time.Minute)},
		{ID: "q1", User: "bob", State: Queued},
		{ID: "o2", User: "ann", State: Admitted, Units: 1, ExpiresAt: opens.Add(time.Minute)},
		{ID: "q2", User: "bob", State: Queued},
	}, later); err != nil {
		t.Fatal(err)
	}
	if got := w.SetAside(); got != 1 {
		t.Fatalf("set aside %d; want 1, ann's last offer's", got)
	}
	if n := w.Len(); n != 1 {
		t.Fatalf("%d waiting; want 1 (bob once)", n)
	}
	if e, _ := w.Get("q2", later); e.Position != 1 {
		t.Fatalf("bob's last entry %+v; want first in line", e)
	}
}

// TestWaitlistOfferPlannedOutOfOrder: a planned offer is made even when one planned ahead of
// it was not (its record failed): its buyer leaves the line from where they stand, the buyer
// not offered keeps the first place, those behind move up, and the next offer goes to the
// first. An offer already made is not made again.
func TestWaitlistOfferPlannedOutOfOrder(t *testing.T) {
	w := newWaitlist(t, nil)
	var got []Entry
	for i := range 4 {
		e, err := w.Join(fmt.Sprintf("w%d", i), opens)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	plan := w.PlanOffers(2, 1, opens)
	if len(plan) != 2 || plan[1].ID != got[1].ID {
		t.Fatalf("plan %v", plan)
	}
	if !w.OfferPlanned(plan[1]) || w.OfferPlanned(plan[1]) {
		t.Fatal("the second planned offer is to be made once")
	}
	if a, n := w.SetAside(), w.Len(); a != 1 || n != 3 {
		t.Fatalf("set aside %d, %d waiting; want 1 and 3", a, n)
	}
	for i, want := range map[int]int{0: 1, 2: 2, 3: 3} {
		if e, _ := w.Get(got[i].ID, opens); e.State != Queued || e.Position != want {
			t.Fatalf("w%d: %+v; want queued at %d", i, e, want)
		}
	}
	if e, _ := w.Get(got[1].ID, opens); e.State != Admitted || e.Units != 1 {
		t.Fatalf("w1: %+v; want an offer of 1", e)
	}
	if next := w.Offer(1, 1, opens); len(next) != 1 || next[0].ID != got[0].ID {
		t.Fatalf("next offer %v; want w0's", next)
	}
	if e, _ := w.Get(got[2].ID, opens); e.Position != 1 {
		t.Fatalf("w2: %+v; want first", e)
	}
}

// TestSecondArriveWaitsForTheFirst: while a buyer's arrival is being recorded, another Arrive
// of the buyer answers an EnteringError whose Done closes when the first settles; the buyer's
// place is then the first one's, never a second.
func TestSecondArriveWaitsForTheFirst(t *testing.T) {
	opens := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	r, err := NewRoom(RoomConfig{Sale: "s", Region: "us", OpensAt: opens, Rate: 1, MaxLive: 1, TicketTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, a, err := r.Arrive("ann", opens)
	if err != nil || a == nil {
		t.Fatalf("first arrive: %v, %v", a, err)
	}
	_, again, err := r.Arrive("ann", opens)
	var ee *EnteringError
	if again != nil || !errors.As(err, &ee) || !errors.Is(err, apierr.ErrAborted) {
		t.Fatalf("second arrive while the first is recorded: %v, %v; want an EnteringError (ABORTED)", again, err)
	}
	select {
	case <-ee.Done:
		t.Fatal("Done closed before the first arrival settled")
	default:
	}
	first := r.Settle(a, true, opens)
	<-ee.Done
	if e, ok := r.Lookup("ann", opens); !ok || e.ID != first.ID {
		t.Fatalf("ann after the first settled: %+v, %v; want the first arrival's place %s", e, ok, first.ID)
	}
}
