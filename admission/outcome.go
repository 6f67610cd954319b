package admission

import (
	"container/heap"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// A Binding entry's outcomes, and the ends of a ticket and of a line.

// Admit records that the caller bound the Binding entry id here and signed a ticket
// expiring at expires: the entry is Admitted. Admitting an entry Admitted with the same
// expiry again answers it; any other state is an error wrapping apierr.ErrConflict (a
// Closed entry: the sale closed while binding, so no ticket should be handed out).
func (r *Room) Admit(id string, expires time.Time) (Entry, error) {
	if expires.IsZero() {
		return Entry{}, apierr.Invalid("expires", "unset")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.lookup(id)
	if err != nil {
		return Entry{}, err
	}
	if e.state == Admitted && e.expires.Equal(expires) {
		return r.view(e, r.clock), nil
	}
	if e.state != Binding {
		return Entry{}, conflict(e, "admit")
	}
	e.state, e.expires = Admitted, expires
	r.binding--
	r.live++
	heap.Push(&r.tickets, e)
	r.touch(e)
	return r.view(e, r.clock), nil
}

// Elsewhere records that the Binding or Admitted entry id's buyer is bound to region, another
// one: the entry ends Elsewhere and frees its place under MaxLive. An Admitted entry's ticket
// is then withdrawn (a room admits before the buyer's binding answers: region/door.go).
// Repeating it with the same region answers the entry; any other state is an error wrapping
// apierr.ErrConflict.
func (r *Room) Elsewhere(id, region string) (Entry, error) {
	if region == "" {
		return Entry{}, apierr.Invalid("region", "empty")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.lookup(id)
	if err != nil {
		return Entry{}, err
	}
	if e.state == Elsewhere && e.region == region {
		return r.view(e, r.clock), nil
	}
	switch e.state {
	case Binding:
		r.binding--
	case Admitted:
		heap.Remove(&r.tickets, e.heapIdx)
		r.live--
	default:
		return Entry{}, conflict(e, "bind elsewhere")
	}
	e.region = region
	r.finish(e, Elsewhere)
	return r.view(e, r.clock), nil
}

// Requeue puts the Binding entry id back at the front of the line (its binding write
// failed; it is picked again by a later Due). An entry already Queued is left as it is; any
// other state is an error wrapping apierr.ErrConflict.
func (r *Room) Requeue(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.lookup(id)
	if err != nil || e.state == Queued {
		return err
	}
	if e.state != Binding {
		return conflict(e, "requeue")
	}
	e.state = Queued
	r.binding--
	r.line.pushFront(e)
	r.touch(e)
	return nil
}

// Used records that the Admitted entry id's ticket backed a reservation: the entry ends
// Used and frees its place under MaxLive. Unknown ids and other states are ignored (a
// ticket used after the room expired it changes nothing here: the writer's check of the
// ticket decides its use).
func (r *Room) Used(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[id]; ok && e.state == Admitted {
		heap.Remove(&r.tickets, e.heapIdx)
		r.live--
		r.finish(e, Used)
	}
}

// Close ends the room's line for reason (the sale sold out or paused): every Queued and
// Binding entry ends Closed with it, and later new arrivals get a Closed entry too. Admitted
// tickets stay valid. Closing again changes nothing.
func (r *Room) Close(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed, r.reason = true, reason
	for _, e := range r.entries {
		if e.state == Queued || e.state == Binding {
			e.reason = reason
			r.finish(e, Closed)
		}
	}
	r.pre, r.post, r.binding = nil, nil, 0
	r.line.clear()
}
