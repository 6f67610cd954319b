package admission

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

var opens = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// countingIDs makes ids id-1, id-2, ... for tests that read them.
func countingIDs() func() string {
	var mu sync.Mutex
	n := 0
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		n++
		return fmt.Sprintf("id-%d", n)
	}
}

func roomConfig() RoomConfig {
	return RoomConfig{Sale: "s1", Region: "eu", OpensAt: opens, PreQueue: time.Minute, Rate: 100,
		MaxLive: 1000, TicketTTL: time.Minute, Seed: 7, NewID: countingIDs()}
}

func newRoom(t *testing.T, edit func(*RoomConfig)) *Room {
	t.Helper()
	cfg := roomConfig()
	if edit != nil {
		edit(&cfg)
	}
	r, err := NewRoom(cfg)
	if err != nil {
		t.Fatalf("NewRoom: %v", err)
	}
	return r
}

func mustEnter(t *testing.T, r *Room, user string, now time.Time) Entry {
	t.Helper()
	e, err := r.Enter(user, now)
	if err != nil {
		t.Fatalf("Enter(%s): %v", user, err)
	}
	return e
}

func ids(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

func TestNewRoomValidates(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*RoomConfig)
	}{
		{"sale", func(c *RoomConfig) { c.Sale = " " }},
		{"region", func(c *RoomConfig) { c.Region = "" }},
		{"opens_at", func(c *RoomConfig) { c.OpensAt = time.Time{} }},
		{"pre_queue", func(c *RoomConfig) { c.PreQueue = -time.Second }},
		{"rate", func(c *RoomConfig) { c.Rate = 0 }},
		{"max_live", func(c *RoomConfig) { c.MaxLive = 0 }},
		{"ticket_ttl", func(c *RoomConfig) { c.TicketTTL = 0 }},
		{"max_queue", func(c *RoomConfig) { c.MaxQueue = -1 }},
	} {
		cfg := roomConfig()
		tc.edit(&cfg)
		_, err := NewRoom(cfg)
		var inv *apierr.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: got %v, want an InvalidError naming it", tc.field, err)
		}
	}
	r := newRoom(t, func(c *RoomConfig) { c.PreQueue, c.MaxQueue, c.NewID = 0, 0, nil })
	if r.cfg.PreQueue != DefaultPreQueue || r.cfg.MaxQueue != DefaultMaxQueue {
		t.Errorf("defaults: %+v", r.cfg)
	}
	if e := mustEnter(t, r, "u", opens); len(e.ID) != 32 {
		t.Errorf("default id %q is not 32 hex characters", e.ID)
	}
}

func TestEnterTooEarlyRefused(t *testing.T) {
	r := newRoom(t, nil)
	now := opens.Add(-time.Minute - time.Millisecond)
	_, err := r.Enter("u", now)
	if !errors.Is(err, apierr.ErrNotOpen) {
		t.Fatalf("got %v, want ErrNotOpen", err)
	}
	for _, want := range []string{"opens_at 2026-03-01T12:00:00.000Z", "server_time 2026-03-01T11:58:59.999Z"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %q", err, want)
		}
	}
	e := mustEnter(t, r, "u", opens.Add(-time.Minute))
	if e.State != Queued || e.Position != 0 || e.EstimatedWait != time.Minute {
		t.Errorf("pre-queued entry %+v: want Queued, position 0, wait 1m", e)
	}
}

func TestEnterSameUserSameEntry(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate = 1000 })
	pre := mustEnter(t, r, "a", opens.Add(-time.Second))
	if again := mustEnter(t, r, "a", opens.Add(-time.Millisecond)); again.ID != pre.ID {
		t.Fatalf("pre-queue: second Enter got %s, want %s", again.ID, pre.ID)
	}
	for _, u := range []string{"b", "c", "d"} {
		mustEnter(t, r, u, opens)
	}
	b := mustEnter(t, r, "b", opens)
	if again := mustEnter(t, r, "b", opens.Add(time.Second)); again != b {
		t.Fatalf("queued: got %+v, want %+v", again, b)
	}
	due := r.Due(opens, 4)
	byUser := map[string]Entry{}
	for _, e := range due {
		byUser[e.User] = e
		if got := mustEnter(t, r, e.User, opens); got.ID != e.ID || got.State != Binding {
			t.Errorf("binding %s: got %+v", e.User, got)
		}
	}
	if _, err := r.Admit(byUser["a"].ID, opens.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Admit(byUser["b"].ID, opens.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	r.Used(byUser["b"].ID)
	if _, err := r.Elsewhere(byUser["c"].ID, "us"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Admit(byUser["d"].ID, opens.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	now := opens.Add(2 * time.Second) // d's ticket has expired
	for _, tc := range []struct {
		user  string
		state EntryState
		same  bool
	}{{"a", Admitted, true}, {"b", Used, true}, {"c", Elsewhere, true}, {"d", Queued, false}} {
		got := mustEnter(t, r, tc.user, now)
		if got.State != tc.state || (got.ID == byUser[tc.user].ID) != tc.same {
			t.Errorf("%s: got %+v, want state %s, same id %v", tc.user, got, tc.state, tc.same)
		}
	}
	if e, _ := r.Get(byUser["c"].ID, now); e.Region != "us" {
		t.Errorf("elsewhere entry %+v does not name its region", e)
	}
}

// preQueueOrder enters users (in the order given) before opening and answers the order
// the room draws at opening.
func preQueueOrder(t *testing.T, seed uint64, sale string, users []string) []string {
	r := newRoom(t, func(c *RoomConfig) { c.Seed, c.Sale, c.Rate = seed, sale, 1e6 })
	for i, u := range users {
		mustEnter(t, r, u, opens.Add(-time.Minute+time.Duration(i)*time.Millisecond))
	}
	late := mustEnter(t, r, "zz-late", opens)
	if late.Position != len(users)+1 {
		t.Fatalf("late arrival at %d, want behind the %d pre-queued", late.Position, len(users))
	}
	var order []string
	for _, e := range r.Due(opens, len(users)) {
		order = append(order, e.User)
	}
	return order
}

func TestPreQueueShuffled(t *testing.T) {
	users := make([]string, 100)
	for i := range users {
		users[i] = fmt.Sprintf("u%03d", i)
	}
	a := preQueueOrder(t, 1, "s1", users)
	if slices.Equal(a, users) {
		t.Fatal("the pre-queue kept the arrival order")
	}
	if sorted := slices.Sorted(slices.Values(a)); !slices.Equal(sorted, users) {
		t.Fatalf("the pre-queue is not a permutation of the arrivals: %v", a)
	}
	reversed := slices.Clone(users)
	slices.Reverse(reversed)
	if b := preQueueOrder(t, 1, "s1", reversed); !slices.Equal(a, b) {
		t.Error("the same seed and entrants drew another order")
	}
	if b := preQueueOrder(t, 2, "s1", users); slices.Equal(a, b) {
		t.Error("another seed drew the same order")
	}
	if b := preQueueOrder(t, 1, "s2", users); slices.Equal(a, b) {
		t.Error("another sale drew the same order")
	}
}

func TestFIFOAfterOpening(t *testing.T) {
	r := newRoom(t, nil)
	var want []string
	for i := range 50 {
		e := mustEnter(t, r, fmt.Sprintf("u%d", i), opens.Add(time.Duration(i)*time.Millisecond))
		if e.Position != i+1 {
			t.Fatalf("arrival %d at position %d", i, e.Position)
		}
		want = append(want, e.ID)
	}
	var got []string
	for now := opens; len(got) < 50; now = now.Add(10 * time.Millisecond) {
		got = append(got, ids(r.Due(now, 7))...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("admitted %v, want arrival order %v", got, want)
	}
}

func TestNothingDueBeforeOpensAt(t *testing.T) {
	r := newRoom(t, nil)
	for i := range 10 {
		mustEnter(t, r, fmt.Sprintf("u%d", i), opens.Add(-time.Second))
	}
	for now := opens.Add(-time.Minute); now.Before(opens); now = now.Add(100 * time.Millisecond) {
		if got := r.Due(now, 10); len(got) != 0 {
			t.Fatalf("Due at %s picked %v before opening", now, got)
		}
	}
	if got := r.Due(opens, 10); len(got) != 10 {
		t.Errorf("Due at opening picked %d, want the burst of 10", len(got))
	}
}

func TestRateBound(t *testing.T) {
	for _, rate := range []float64{100, 5, 0.5} {
		r := newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxLive = rate, 1e6 })
		for i := range 2000 {
			mustEnter(t, r, fmt.Sprintf("u%d", i), opens)
		}
		picked := 0
		for now := opens; !now.After(opens.Add(time.Second)); now = now.Add(10 * time.Millisecond) {
			picked += len(r.Due(now, 1000))
		}
		want := max(1, rate/10) + rate // the burst at opening, then the rate
		if float64(picked) < want-2 || float64(picked) > want+1 {
			t.Errorf("rate %v: %d picked in one second, want about %v", rate, picked, want)
		}
	}
}

func TestMaxLiveBound(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxLive = 1e6, 3 })
	for i := range 10 {
		mustEnter(t, r, fmt.Sprintf("u%d", i), opens)
	}
	due := r.Due(opens, 10)
	if len(due) != 3 {
		t.Fatalf("picked %d, want MaxLive 3", len(due))
	}
	if _, err := r.Admit(due[0].ID, opens.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	now := opens.Add(time.Second)
	if got := r.Due(now, 10); len(got) != 0 {
		t.Fatalf("picked %d over MaxLive", len(got))
	}
	r.Used(due[0].ID)
	r.Used(due[0].ID) // idempotent
	r.Used("nope")
	if _, err := r.Elsewhere(due[1].ID, "us"); err != nil {
		t.Fatal(err)
	}
	if err := r.Requeue(due[2].ID); err != nil {
		t.Fatal(err)
	}
	got := r.Due(now.Add(time.Second), 10)
	if len(got) != 3 || got[0].ID != due[2].ID {
		t.Errorf("after freeing three places got %v, want 3 led by the requeued %s", ids(got), due[2].ID)
	}
	if s := r.Stats(now); s.Binding != 3 || s.Live != 0 || s.Used != 1 || s.Elsewhere != 1 || s.Queued != 5 {
		t.Errorf("stats %+v", s)
	}
}

func TestExpiryFreesCapacity(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxLive = 1e6, 1 })
	a := mustEnter(t, r, "a", opens)
	b := mustEnter(t, r, "b", opens)
	r.Due(opens, 5)
	exp := opens.Add(time.Minute)
	if _, err := r.Admit(a.ID, exp); err != nil {
		t.Fatal(err)
	}
	if got := r.Due(exp.Add(-time.Nanosecond), 5); len(got) != 0 {
		t.Fatalf("picked %v while a's ticket is live", ids(got))
	}
	if e, _ := r.Get(a.ID, exp); e.State != Expired || e.ExpiresAt != exp {
		t.Errorf("Get at expiry: %+v, want Expired", e)
	}
	if got := r.Due(exp, 5); len(got) != 1 || got[0].ID != b.ID {
		t.Fatalf("after a's ticket expired picked %v, want b", ids(got))
	}
	if s := r.Stats(exp); s.Expired != 1 || s.Live != 0 || s.Binding != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestCloseClosesQueued(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate = 1e6 })
	pre := mustEnter(t, r, "pre", opens.Add(-time.Second))
	var es []Entry
	for i := range 4 {
		es = append(es, mustEnter(t, r, fmt.Sprintf("u%d", i), opens))
	}
	due := r.Due(opens, 2) // pre, then u0
	if due[0].ID != pre.ID {
		t.Fatalf("picked %v, want the pre-queued first", ids(due))
	}
	if _, err := r.Admit(due[0].ID, opens.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	r.Close("sold out")
	r.Close("paused") // the first reason stays
	now := opens.Add(time.Second)
	if e, _ := r.Get(due[0].ID, now); e.State != Admitted {
		t.Errorf("admitted entry after Close: %+v", e)
	}
	for _, id := range ids(es) { // u0 binding, u1..u3 queued
		if e, _ := r.Get(id, now); e.State != Closed || e.Reason != "sold out" || e.Position != 0 {
			t.Errorf("entry %s after Close: %+v, want Closed: sold out", id, e)
		}
	}
	if _, err := r.Admit(due[1].ID, now.Add(time.Minute)); !errors.Is(err, apierr.ErrConflict) {
		t.Errorf("Admit of an entry closed while binding: %v, want ErrConflict", err)
	}
	if e := mustEnter(t, r, "new", now); e.State != Closed || e.Reason != "sold out" || e.ID != "" {
		t.Errorf("new arrival after Close: %+v", e)
	}
	if got := r.Due(now, 10); len(got) != 0 {
		t.Errorf("Due after Close picked %v", ids(got))
	}
	if s := r.Stats(now); s.Queued != 0 || s.Binding != 0 || s.Live != 1 || s.Closed != 4 {
		t.Errorf("stats %+v", s)
	}
}

func TestMaxQueueOverloaded(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxQueue = 1e6, 3 })
	var es []Entry
	for i := range 3 {
		es = append(es, mustEnter(t, r, fmt.Sprintf("u%d", i), opens))
	}
	_, err := r.Enter("u3", opens)
	var over *apierr.OverloadedError
	if !errors.As(err, &over) || !errors.Is(err, apierr.ErrOverloaded) || over.RetryAfter < time.Second {
		t.Fatalf("fourth Enter: %v, want an OverloadedError", err)
	}
	if again := mustEnter(t, r, "u0", opens); again.ID != es[0].ID {
		t.Errorf("a user with a place is refused or moved: %+v", again)
	}
	due := r.Due(opens, 1)
	if _, err := r.Admit(due[0].ID, opens.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	r.Used(due[0].ID)
	if _, err := r.Enter("u3", opens.Add(2*time.Minute-time.Millisecond)); !errors.As(err, &over) {
		t.Fatalf("Enter within the retention: %v, want an OverloadedError", err)
	} else if over.RetryAfter != time.Second {
		t.Errorf("retry after %s, want 1s (the floor)", over.RetryAfter)
	}
	later := opens.Add(2 * time.Minute)
	if e := mustEnter(t, r, "u3", later); e.State != Queued {
		t.Fatalf("Enter after the retention: %+v", e)
	}
	if _, ok := r.Get(es[0].ID, later); ok {
		t.Error("the dropped entry is still found")
	}
	if s := r.Stats(later); s.Entries != 3 || s.Used != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestPositionDecreases(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxLive, c.TicketTTL = 10, 1000, time.Minute })
	last := mustEnter(t, r, "u0", opens)
	for i := 1; i < 100; i++ {
		last = mustEnter(t, r, fmt.Sprintf("u%d", i), opens)
	}
	if last.Position != 100 || last.EstimatedWait != 10*time.Second {
		t.Fatalf("last arrival %+v: want position 100, wait 10s", last)
	}
	prev := last
	for now := opens; ; now = now.Add(100 * time.Millisecond) {
		for _, d := range r.Due(now, 100) {
			if _, err := r.Admit(d.ID, now.Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
		e, _ := r.Get(last.ID, now)
		if e.State != Queued {
			break
		}
		if e.Position > prev.Position || e.EstimatedWait > prev.EstimatedWait {
			t.Fatalf("position went from %d to %d", prev.Position, e.Position)
		}
		prev = e
	}
	if prev.Position != 1 {
		t.Errorf("the last position seen was %d, want 1", prev.Position)
	}
	// The live cap bounds the flow: 2 tickets of a minute move the line at 2 a minute.
	r = newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxLive, c.TicketTTL = 100, 2, time.Minute })
	mustEnter(t, r, "a", opens)
	if e := mustEnter(t, r, "b", opens); (e.EstimatedWait - time.Minute).Abs() > time.Millisecond {
		t.Errorf("position 2 under a live cap of 2 per minute waits %s, want 1m", e.EstimatedWait)
	}
}

func TestWrongStateConflict(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate = 1e6 })
	q := mustEnter(t, r, "q", opens)
	a := mustEnter(t, r, "a", opens)
	r.Due(opens, 1) // q is Binding
	exp := opens.Add(time.Minute)
	if _, err := r.Admit(q.ID, exp); err != nil {
		t.Fatal(err)
	}
	if e, err := r.Admit(q.ID, exp); err != nil || e.State != Admitted {
		t.Errorf("repeated Admit: %+v, %v", e, err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"admit queued", second(r.Admit(a.ID, exp)), apierr.ErrConflict},
		{"admit again, other expiry", second(r.Admit(q.ID, exp.Add(time.Second))), apierr.ErrConflict},
		{"admit unknown", second(r.Admit("nope", exp)), apierr.ErrNotFound},
		{"admit zero expiry", second(r.Admit(q.ID, time.Time{})), apierr.ErrInvalid},
		{"elsewhere no region", second(r.Elsewhere(q.ID, "")), apierr.ErrInvalid},
		{"requeue admitted", r.Requeue(q.ID), apierr.ErrConflict},
		{"requeue unknown", r.Requeue("nope"), apierr.ErrNotFound},
		{"requeue queued", r.Requeue(a.ID), nil},
		{"enter no user", second(r.Enter("", opens)), apierr.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) || (tc.want == nil) != (tc.err == nil) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// An Admitted entry whose buyer's binding answers another region ends Elsewhere: its ticket
// is withdrawn and its place under MaxLive freed; a Used one stays Used.
func TestElsewhereWithdrawsAnAdmission(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxLive = 1e6, 1 })
	a := mustEnter(t, r, "a", opens)
	b := mustEnter(t, r, "b", opens)
	r.Due(opens, 2) // a only: one live ticket at most
	if _, err := r.Admit(a.ID, opens.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if due := r.Due(opens, 2); len(due) != 0 {
		t.Fatalf("due with the one live ticket taken: %+v", due)
	}
	e, err := r.Elsewhere(a.ID, "eu")
	if err != nil || e.State != Elsewhere || e.Region != "eu" {
		t.Fatalf("Elsewhere of an admitted entry: %+v, %v", e, err)
	}
	if st := r.Stats(opens); st.Live != 0 || st.Elsewhere != 1 {
		t.Errorf("stats after withdrawing: %+v, want no live ticket, one elsewhere", st)
	}
	if due := r.Due(opens, 2); len(due) != 1 || due[0].ID != b.ID {
		t.Fatalf("due after withdrawing a's ticket: %+v, want b", due)
	}
	if _, err := r.Admit(b.ID, opens.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	r.Used(b.ID)
	if _, err := r.Elsewhere(b.ID, "eu"); !errors.Is(err, apierr.ErrConflict) {
		t.Errorf("Elsewhere of a used entry: %v, want CONFLICT", err)
	}
}

func TestRoomConcurrent(t *testing.T) {
	r := newRoom(t, func(c *RoomConfig) { c.Rate, c.MaxLive, c.NewID = 1000, 20, nil })
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				now := opens.Add(time.Duration(i) * time.Millisecond)
				e, err := r.Enter(fmt.Sprintf("g%d-u%d", g, i%50), now)
				if err != nil {
					t.Error(err)
					return
				}
				r.Get(e.ID, now)
			}
		})
	}
	wg.Go(func() {
		for i := range 400 {
			now := opens.Add(time.Duration(i) * time.Millisecond)
			for _, e := range r.Due(now, 5) {
				if i%3 == 0 {
					_ = r.Requeue(e.ID)
				} else if _, err := r.Admit(e.ID, now.Add(50*time.Millisecond)); err == nil && i%2 == 0 {
					r.Used(e.ID)
				}
			}
			if s := r.Stats(now); s.Binding+s.Live > 20 {
				t.Errorf("binding %d + live %d over MaxLive 20", s.Binding, s.Live)
			}
		}
	})
	wg.Wait()
}

// roomModel is the reference a Room is checked against: plain slices and maps, the line
// in order, the token bucket as specified.
type roomModel struct {
	cfg     RoomConfig
	opened  bool
	closed  bool
	line    []string // Queued ids in order, once opened
	pre     []string
	state   map[string]EntryState
	user    map[string]string
	expires map[string]time.Time
	cur     map[string]string
	tokens  float64
	filled  time.Time
	ended   map[EntryState]int
	binding int
	live    int
}

func newRoomModel(cfg RoomConfig) *roomModel {
	return &roomModel{cfg: cfg, state: map[string]EntryState{}, user: map[string]string{},
		expires: map[string]time.Time{}, cur: map[string]string{}, ended: map[EntryState]int{},
		tokens: max(1, cfg.Rate/10), filled: cfg.OpensAt}
}

func (m *roomModel) end(id string, s EntryState) {
	m.state[id] = s
	m.ended[s]++
}

func (m *roomModel) expire(now time.Time) {
	for id, s := range m.state {
		if s == Admitted && !now.Before(m.expires[id]) {
			m.live--
			m.end(id, Expired)
		}
	}
}

// open takes the room's draw of the pre-queue, checking it is a permutation.
func (m *roomModel) open(t *testing.T, r *Room, now time.Time) {
	if m.opened || now.Before(m.cfg.OpensAt) {
		return
	}
	m.opened = true
	drawn := make([]string, len(m.pre))
	for _, id := range m.pre {
		e, ok := r.Get(id, now)
		if !ok || e.Position < 1 || e.Position > len(m.pre) || drawn[e.Position-1] != "" {
			t.Fatalf("pre-queued %s at %+v after opening", id, e)
		}
		drawn[e.Position-1] = id
	}
	m.line = append(drawn, m.line...)
	m.pre = nil
}

func (m *roomModel) enter(t *testing.T, r *Room, user string, now time.Time) {
	m.expire(now)
	got, err := r.Enter(user, now)
	if id, ok := m.cur[user]; ok && m.state[id] != Expired {
		if err != nil || got.ID != id {
			t.Fatalf("Enter(%s) again: %+v, %v; want %s", user, got, err, id)
		}
		return
	}
	switch {
	case m.closed:
		if err != nil || got.State != Closed || got.ID != "" {
			t.Fatalf("Enter(%s) after Close: %+v, %v", user, got, err)
		}
		return
	case !m.opened && now.Before(m.cfg.OpensAt.Add(-m.cfg.PreQueue)):
		if !errors.Is(err, apierr.ErrNotOpen) {
			t.Fatalf("Enter(%s) too early: %v", user, err)
		}
		return
	case err != nil || got.State != Queued:
		t.Fatalf("Enter(%s): %+v, %v", user, got, err)
	}
	m.open(t, r, now)
	m.state[got.ID], m.user[got.ID], m.cur[user] = Queued, user, got.ID
	if m.opened {
		m.line = append(m.line, got.ID)
	} else {
		m.pre = append(m.pre, got.ID)
	}
}

func (m *roomModel) due(t *testing.T, r *Room, now time.Time, most int) []string {
	m.expire(now)
	m.open(t, r, now) // reads the draw before Due picks from it
	got := ids(r.Due(now, most))
	if m.closed || now.Before(m.cfg.OpensAt) {
		if len(got) != 0 {
			t.Fatalf("Due picked %v closed or before opening", got)
		}
		return nil
	}
	if now.After(m.filled) {
		m.tokens = min(max(1, m.cfg.Rate/10), m.tokens+now.Sub(m.filled).Seconds()*m.cfg.Rate)
		m.filled = now
	}
	n := min(most, m.cfg.MaxLive-m.binding-m.live, len(m.line))
	if float64(n) > m.tokens {
		n = int(m.tokens)
	}
	n = max(n, 0)
	if !slices.Equal(got, m.line[:n]) {
		t.Fatalf("Due(%d) picked %v, want %v (line %v)", most, got, m.line[:n], m.line)
	}
	m.tokens -= float64(n)
	for _, id := range got {
		m.state[id] = Binding
	}
	m.binding += n
	m.line = m.line[n:]
	return got
}

// check compares every entry and the stats.
func (m *roomModel) check(t *testing.T, r *Room, now time.Time) {
	m.open(t, r, now)
	pos := map[string]int{}
	for i, id := range m.line {
		pos[id] = i + 1 + m.binding // those being bound count ahead
	}
	for id, s := range m.state {
		e, ok := r.Get(id, now)
		want := s
		if s == Admitted && !now.Before(m.expires[id]) {
			want = Expired
		}
		if !ok || e.State != want || e.Position != pos[id] || e.User != m.user[id] {
			t.Fatalf("Get(%s) = %+v, %v; want %s at %d", id, e, ok, want, pos[id])
		}
	}
	if m.binding+m.live > m.cfg.MaxLive {
		t.Fatalf("model over MaxLive: %d + %d", m.binding, m.live)
	}
	m.expire(now)
	want := RoomStats{Queued: len(m.line) + len(m.pre), Binding: m.binding, Live: m.live, Used: m.ended[Used],
		Expired: m.ended[Expired], Elsewhere: m.ended[Elsewhere], Closed: m.ended[Closed], Entries: len(m.state)}
	if got := r.Stats(now); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
}

func (m *roomModel) pick(rng *rand.Rand, s EntryState) (string, bool) {
	var c []string
	for id, st := range m.state {
		if st == s {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return "", false
	}
	slices.Sort(c)
	return c[rng.IntN(len(c))], true
}

// step applies one random call to the room and the model.
func (m *roomModel) step(t *testing.T, r *Room, rng *rand.Rand, now time.Time) {
	switch k := rng.IntN(20); {
	case k < 8:
		m.enter(t, r, fmt.Sprintf("u%d", rng.IntN(40)), now)
	case k < 11:
		m.due(t, r, now, 1+rng.IntN(4))
	case k < 14:
		if id, ok := m.pick(rng, Binding); ok {
			exp := now.Add(time.Duration(100+rng.IntN(900)) * time.Millisecond)
			if e, err := r.Admit(id, exp); err != nil || e.State != Admitted {
				t.Fatalf("Admit(%s): %+v, %v", id, e, err)
			}
			m.state[id], m.expires[id] = Admitted, exp
			m.binding--
			m.live++
		}
	case k < 15:
		if id, ok := m.pick(rng, Binding); ok {
			if err := r.Requeue(id); err != nil {
				t.Fatalf("Requeue(%s): %v", id, err)
			}
			m.state[id] = Queued
			m.binding--
			m.line = append([]string{id}, m.line...)
		}
	case k < 16:
		if id, ok := m.pick(rng, Binding); ok {
			if _, err := r.Elsewhere(id, "us"); err != nil {
				t.Fatalf("Elsewhere(%s): %v", id, err)
			}
			m.binding--
			m.end(id, Elsewhere)
		}
	case k < 19:
		if id, ok := m.pick(rng, Admitted); ok {
			r.Used(id) // even when its expiry has passed unrecorded: it is still Admitted
			if m.state[id] == Admitted {
				m.live--
				m.end(id, Used)
			}
		} else if id, ok := m.pick(rng, Queued); ok {
			if _, err := r.Admit(id, now.Add(time.Second)); !errors.Is(err, apierr.ErrConflict) {
				t.Fatalf("Admit of queued %s: %v", id, err)
			}
		}
	default:
		if rng.IntN(60) == 0 { // about two runs in five close
			r.Close("sold out")
			if !m.closed {
				m.closed = true
				for id, s := range m.state {
					if s == Queued || s == Binding {
						m.end(id, Closed)
					}
				}
				m.line, m.pre, m.binding = nil, nil, 0
			}
		}
	}
}

func TestRoomAgainstModel(t *testing.T) {
	seen := map[EntryState]int{}
	for seed := range uint64(60) {
		rng := rand.New(rand.NewPCG(seed, 99))
		cfg := RoomConfig{Sale: "s", Region: "eu", OpensAt: opens, PreQueue: time.Second,
			Rate: []float64{3, 20, 200}[seed%3], MaxLive: 1 + rng.IntN(6), TicketTTL: time.Second,
			MaxQueue: 1 << 20, Seed: seed, NewID: countingIDs()}
		r, err := NewRoom(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := newRoomModel(cfg)
		now := opens.Add(-2 * time.Second)
		for range 600 {
			now = now.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
			m.step(t, r, rng, now)
			if rng.IntN(10) == 0 {
				m.check(t, r, now)
			}
		}
		m.check(t, r, now)
		for s, n := range m.ended {
			seen[s] += n
		}
	}
	for _, s := range []EntryState{Used, Expired, Elsewhere, Closed} {
		if seen[s] == 0 {
			t.Errorf("no run ended an entry %s: the model test misses it", s)
		}
	}
	t.Logf("entries ended: %v", seen)
}
