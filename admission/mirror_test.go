package admission

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestMirrorAnswersAsTheRoom drives a room through random arrivals (in the pre-queue and
// after opening), admissions, bindings elsewhere, requeues, uses, expiries, drops and a
// close, following it with mirrors fed a few changes at a time; after every step each
// mirror answers every entry exactly as the room's Get does (state, position, estimate,
// expiry), and answers no entry the room no longer holds.
func TestMirrorAnswersAsTheRoom(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { mirrorRun(t, seed) })
	}
}

func mirrorRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	r := newRoom(t, func(c *RoomConfig) { c.MaxQueue, c.MaxLive, c.TicketTTL = 60, 5, 3*time.Second })
	mirrors := []*Mirror{NewMirror(), NewMirror()}
	limits := []int{1 + rng.IntN(5), 1000}
	now := opens.Add(-30 * time.Second)
	var seen []string
	binding := map[string]bool{}
	for step := range 400 {
		now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		switch op := rng.IntN(10); {
		case op < 4:
			if e, err := r.Enter(fmt.Sprintf("u%d", rng.IntN(80)), now); err == nil && e.ID != "" {
				seen = append(seen, e.ID)
			}
		case op < 6:
			for _, e := range r.Due(now, 1+rng.IntN(3)) {
				binding[e.ID] = true
			}
		case op < 9:
			for id := range binding {
				delete(binding, id)
				switch rng.IntN(4) {
				case 0:
					_, _ = r.Elsewhere(id, "us")
				case 1:
					_ = r.Requeue(id)
				default:
					if _, err := r.Admit(id, now.Add(time.Duration(1+rng.IntN(3))*time.Second)); err == nil {
						switch rng.IntN(3) {
						case 0:
							r.Used(id)
						case 1:
							_, _ = r.Elsewhere(id, "eu") // the binding answered after the admission
						}
					}
				}
				break
			}
		default:
			if rng.IntN(30) == 0 {
				r.Close("SOLD_OUT")
			}
		}
		for i, m := range mirrors {
			follow(m, r, limits[i], now)
			compareMirror(t, step, m, r, seen, now)
		}
	}
}

// follow feeds m until it has all of r's changes.
func follow(m *Mirror, r *Room, limit int, now time.Time) {
	for range 10000 {
		room, since := m.Since()
		f := r.Changes(room, since, limit, now)
		m.Apply(f, now)
		if !f.More {
			return
		}
	}
	panic("the feed never ended")
}

func compareMirror(t *testing.T, step int, m *Mirror, r *Room, seen []string, now time.Time) {
	t.Helper()
	for _, id := range seen {
		want, wok := r.Get(id, now)
		got, gok := m.Get(id, now)
		if wok != gok || want != got {
			t.Fatalf("step %d: entry %s: mirror %v %+v, room %v %+v", step, id, gok, got, wok, want)
		}
	}
}

// TestMirrorStartsOverWithAnotherRoom: a mirror of one room that is fed by another (a new
// leader restored the line) gets every entry of the new room and none of the old.
func TestMirrorStartsOverWithAnotherRoom(t *testing.T) {
	now := opens.Add(time.Second)
	a := newRoom(t, nil)
	ea := mustEnter(t, a, "alice", now)
	m := NewMirror()
	follow(m, a, 10, now)
	if _, ok := m.Get(ea.ID, now); !ok {
		t.Fatal("the mirror lacks alice's entry")
	}
	b := newRoom(t, func(c *RoomConfig) { c.NewID = func() string { return "b-1" } })
	if err := b.Restore([]Stored{{ID: "b-1", User: "bob", State: Queued}}, now); err != nil {
		t.Fatal(err)
	}
	follow(m, b, 10, now)
	if _, ok := m.Get(ea.ID, now); ok {
		t.Error("the mirror kept an entry of the room it no longer follows")
	}
	if e, ok := m.Get("b-1", now); !ok || e.Position != 1 {
		t.Errorf("bob's entry: %v %+v, want position 1", ok, e)
	}
}
