package admission

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

func newWaitlist(t *testing.T, edit func(*WaitlistConfig)) *Waitlist {
	t.Helper()
	cfg := WaitlistConfig{Sale: "s1", SKU: "k1", Region: "eu", OfferTTL: time.Minute, NewID: countingIDs()}
	if edit != nil {
		edit(&cfg)
	}
	w, err := NewWaitlist(cfg)
	if err != nil {
		t.Fatalf("NewWaitlist: %v", err)
	}
	return w
}

func mustJoin(t *testing.T, w *Waitlist, user string, now time.Time) Entry {
	t.Helper()
	e, err := w.Join(user, now)
	if err != nil {
		t.Fatalf("Join(%s): %v", user, err)
	}
	return e
}

func TestNewWaitlistValidates(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*WaitlistConfig)
	}{
		{"sale", func(c *WaitlistConfig) { c.Sale = "" }},
		{"sku", func(c *WaitlistConfig) { c.SKU = " " }},
		{"region", func(c *WaitlistConfig) { c.Region = "" }},
		{"offer_ttl", func(c *WaitlistConfig) { c.OfferTTL = -1 }},
		{"max_entries", func(c *WaitlistConfig) { c.MaxEntries = -1 }},
	} {
		cfg := WaitlistConfig{Sale: "s", SKU: "k", Region: "eu"}
		tc.edit(&cfg)
		_, err := NewWaitlist(cfg)
		var inv *apierr.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: got %v, want an InvalidError naming it", tc.field, err)
		}
	}
	w, err := NewWaitlist(WaitlistConfig{Sale: "s", SKU: "k", Region: "eu"})
	if err != nil || w.cfg.OfferTTL != DefaultOfferTTL || w.cfg.MaxEntries != DefaultMaxEntries {
		t.Errorf("defaults: %+v, %v", w, err)
	}
}

func TestWaitlistFIFOOffers(t *testing.T) {
	w := newWaitlist(t, nil)
	var es []Entry
	for i, u := range []string{"a", "b", "c", "d"} {
		e := mustJoin(t, w, u, opens)
		if e.State != Queued || e.Position != i+1 {
			t.Fatalf("Join(%s) = %+v, want Queued at %d", u, e, i+1)
		}
		es = append(es, e)
	}
	if got := w.Offer(0, 2, opens); len(got) != 0 {
		t.Fatalf("Offer of no units made %v", got)
	}
	got := w.Offer(5, 2, opens)
	exp := opens.Add(time.Minute)
	want := []Offer{{es[0].ID, "a", 2, exp}, {es[1].ID, "b", 2, exp}, {es[2].ID, "c", 1, exp}}
	if !slices.Equal(got, want) {
		t.Fatalf("offers %v, want %v", got, want)
	}
	if w.SetAside() != 5 || w.Len() != 1 {
		t.Errorf("set aside %d, waiting %d; want 5, 1", w.SetAside(), w.Len())
	}
	if e, _ := w.Get(es[3].ID, opens); e.Position != 1 {
		t.Errorf("d after the offers: %+v, want position 1", e)
	}
	if e, _ := w.Get(es[0].ID, opens); e.State != Admitted || e.ExpiresAt != exp || e.Units != 2 {
		t.Errorf("a holding an offer: %+v", e)
	}
	if again := mustJoin(t, w, "a", opens); again.ID != es[0].ID || again.State != Admitted {
		t.Errorf("a joining again: %+v", again)
	}
	if got := w.Offer(3, 0, opens); len(got) != 1 || got[0].Units != 1 || got[0].User != "d" {
		t.Errorf("perBuyer 0 counts as 1: %v", got)
	}
}

func TestWaitlistClaimedAndExpire(t *testing.T) {
	w := newWaitlist(t, nil)
	a := mustJoin(t, w, "a", opens)
	b := mustJoin(t, w, "b", opens)
	w.Offer(4, 2, opens)
	w.Claimed(a.ID, 1) // the buyer reserved 1 of 2: the other is owed back
	w.Claimed(a.ID, 1)
	w.Claimed("nope", 1)
	if w.SetAside() != 2 {
		t.Fatalf("set aside %d, want b's 2", w.SetAside())
	}
	exp := opens.Add(time.Minute)
	if e, _ := w.Get(b.ID, exp); e.State != Expired {
		t.Errorf("b at its expiry reads %s, want Expired", e.State)
	}
	if n := w.Expire(exp.Add(-time.Nanosecond)); n != 1 || w.SetAside() != 2 {
		t.Errorf("Expire before b's expiry: %d back, %d set aside; want 1, 2", n, w.SetAside())
	}
	if n := w.Expire(exp); n != 2 || w.SetAside() != 0 {
		t.Errorf("Expire at b's expiry: %d back, %d set aside; want 2, 0", n, w.SetAside())
	}
	if e := mustJoin(t, w, "a", exp); e.ID != a.ID || e.State != Used {
		t.Errorf("a after claiming: %+v, want the Used entry", e)
	}
	if e := mustJoin(t, w, "b", exp); e.ID == b.ID || e.State != Queued || e.Position != 1 {
		t.Errorf("b after its offer expired: %+v, want a new place", e)
	}
	w.Claimed(b.ID, 2) // expired: ignored
	if n := w.Expire(exp); n != 0 {
		t.Errorf("Expire again answered %d", n)
	}
}

func TestWaitlistJoinExpiresOffers(t *testing.T) {
	w := newWaitlist(t, nil)
	a := mustJoin(t, w, "a", opens)
	w.Offer(3, 3, opens)
	later := opens.Add(time.Minute)
	if e := mustJoin(t, w, "b", later); e.Position != 1 {
		t.Fatalf("b: %+v", e)
	}
	if e, _ := w.Get(a.ID, later); e.State != Expired || w.SetAside() != 0 {
		t.Errorf("a's offer after a Join past its expiry: %+v, set aside %d", e, w.SetAside())
	}
	if n := w.Expire(later); n != 3 {
		t.Errorf("Expire answered %d, want the 3 a's offer had", n)
	}
}

func TestWaitlistMaxEntries(t *testing.T) {
	w := newWaitlist(t, func(c *WaitlistConfig) { c.MaxEntries = 2 })
	a := mustJoin(t, w, "a", opens)
	mustJoin(t, w, "b", opens)
	_, err := w.Join("c", opens)
	var over *apierr.OverloadedError
	if !errors.As(err, &over) {
		t.Fatalf("third Join: %v, want an OverloadedError", err)
	}
	w.Offer(1, 1, opens)
	w.Claimed(a.ID, 1)
	if _, err := w.Join("c", opens.Add(time.Minute)); !errors.As(err, &over) {
		t.Fatalf("Join within the retention: %v", err)
	}
	later := opens.Add(2 * time.Minute)
	if e := mustJoin(t, w, "c", later); e.Position != 2 {
		t.Errorf("c after a's entry was dropped: %+v", e)
	}
	if _, ok := w.Get(a.ID, later); ok {
		t.Error("the dropped entry is still found")
	}
	if _, err := w.Join("", later); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("Join without a user: %v", err)
	}
}

func TestWaitlistConcurrent(t *testing.T) {
	w := newWaitlist(t, func(c *WaitlistConfig) { c.NewID = nil })
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				now := opens.Add(time.Duration(i) * time.Second)
				e, err := w.Join(fmt.Sprintf("g%d-u%d", g, i%30), now)
				if err != nil {
					t.Error(err)
					return
				}
				w.Get(e.ID, now)
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			now := opens.Add(time.Duration(i) * time.Second)
			for _, o := range w.Offer(2+w.Expire(now), 1, now) {
				if i%2 == 0 {
					w.Claimed(o.ID, o.Units)
				}
			}
			if w.SetAside() < 0 {
				t.Error("negative set aside")
			}
		}
	})
	wg.Wait()
}

// waitModel is the reference a Waitlist is checked against.
type waitModel struct {
	line     []string
	state    map[string]EntryState
	user     map[string]string
	units    map[string]int
	expires  map[string]time.Time
	cur      map[string]string
	owed     int
	offered  int // every unit ever offered
	claimed  int
	returned int // every unit Expire answered
}

func (m *waitModel) setAside() int {
	n := 0
	for id, s := range m.state {
		if s == Admitted {
			n += m.units[id]
		}
	}
	return n
}

func (m *waitModel) expire(now time.Time) {
	for id, s := range m.state {
		if s == Admitted && !now.Before(m.expires[id]) {
			m.state[id] = Expired
			m.owed += m.units[id]
		}
	}
}

func (m *waitModel) join(t *testing.T, w *Waitlist, user string, now time.Time) {
	m.expire(now)
	e, err := w.Join(user, now)
	if err != nil {
		t.Fatalf("Join(%s): %v", user, err)
	}
	if id, ok := m.cur[user]; ok && m.state[id] != Expired {
		if e.ID != id || e.State != m.state[id] {
			t.Fatalf("Join(%s) again = %+v, want %s %s", user, e, id, m.state[id])
		}
		return
	}
	m.line = append(m.line, e.ID)
	m.state[e.ID], m.user[e.ID], m.cur[user] = Queued, user, e.ID
	if e.Position != len(m.line) {
		t.Fatalf("Join(%s) at %d, want %d", user, e.Position, len(m.line))
	}
}

func (m *waitModel) offer(t *testing.T, w *Waitlist, units, per int, now time.Time, ttl time.Duration) {
	got := w.Offer(units, per, now)
	var want []Offer
	for units > 0 && len(m.line) > 0 {
		id := m.line[0]
		m.line = m.line[1:]
		n := min(units, per)
		units -= n
		m.state[id], m.units[id], m.expires[id] = Admitted, n, now.Add(ttl)
		m.offered += n
		want = append(want, Offer{ID: id, User: m.user[id], Units: n, Expires: now.Add(ttl)})
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Offer = %v, want %v", got, want)
	}
}

func (m *waitModel) check(t *testing.T, w *Waitlist, now time.Time) {
	if got, want := w.SetAside(), m.setAside(); got != want {
		t.Fatalf("SetAside = %d, want the outstanding offers' %d", got, want)
	}
	if w.Len() != len(m.line) {
		t.Fatalf("Len = %d, want %d", w.Len(), len(m.line))
	}
	if m.offered != m.claimed+m.returned+m.owed+m.setAside() {
		t.Fatalf("units offered %d != claimed %d + returned %d + owed %d + set aside %d",
			m.offered, m.claimed, m.returned, m.owed, m.setAside())
	}
	for i, id := range m.line {
		if e, ok := w.Get(id, now); !ok || e.State != Queued || e.Position != i+1 {
			t.Fatalf("Get(%s) = %+v, want Queued at %d", id, e, i+1)
		}
	}
	for id, s := range m.state {
		want := s
		if s == Admitted && !now.Before(m.expires[id]) {
			want = Expired
		}
		if e, ok := w.Get(id, now); !ok || e.State != want {
			t.Fatalf("Get(%s) = %+v, want %s", id, e, want)
		}
	}
}

func (m *waitModel) step(t *testing.T, w *Waitlist, rng *rand.Rand, now time.Time, ttl time.Duration) {
	switch k := rng.IntN(10); {
	case k < 4:
		m.join(t, w, fmt.Sprintf("u%d", rng.IntN(30)), now)
	case k < 6:
		m.offer(t, w, rng.IntN(6), 1+rng.IntN(3), now, ttl)
	case k < 8:
		var out []string
		for id, s := range m.state {
			if s == Admitted || s == Used {
				out = append(out, id)
			}
		}
		if len(out) == 0 {
			return
		}
		slices.Sort(out)
		id, units := out[rng.IntN(len(out))], rng.IntN(4)
		w.Claimed(id, units)
		if m.state[id] == Admitted {
			got := min(units, m.units[id])
			m.claimed += got
			m.owed += m.units[id] - got
			m.state[id] = Used
		}
	default:
		m.expire(now)
		got := w.Expire(now)
		if got != m.owed {
			t.Fatalf("Expire = %d, want %d", got, m.owed)
		}
		m.returned += got
		m.owed = 0
	}
}

func TestWaitlistAgainstModel(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		ttl := time.Duration(200+rng.IntN(800)) * time.Millisecond
		w := newWaitlist(t, func(c *WaitlistConfig) { c.OfferTTL = ttl })
		m := &waitModel{state: map[string]EntryState{}, user: map[string]string{}, units: map[string]int{},
			expires: map[string]time.Time{}, cur: map[string]string{}}
		now := opens
		for range 500 {
			now = now.Add(time.Duration(rng.IntN(60)) * time.Millisecond)
			m.step(t, w, rng, now, ttl)
			m.check(t, w, now)
		}
	}
}
