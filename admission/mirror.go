package admission

import (
	"sync"
	"time"
)

// Mirror is a copy of one room kept from its feed (Room.Changes), which answers polls of the
// room's entries as Room.Get would have at the room's last feed: the same state, position,
// estimate and expiry, with no call to the room. It is what a storefront edge keeps of each
// sale's line; it is soft state, filled again from the room at any time. One difference:
// before the room's opening draw is in a feed, a queued entry shows no position and no wait
// (the room draws at its first call at or after opens_at, within one admitting tick). A
// Mirror is safe for concurrent use.
type Mirror struct {
	mu      sync.Mutex
	f       Feed // the counters of the last feed; Entries unused
	entries map[string]*FeedEntry
	byUser  map[string]*FeedEntry
	// at is when the last feed was applied (the zero time: never).
	at time.Time
}

// NewMirror makes an empty mirror: it knows no entry until its first feed.
func NewMirror() *Mirror {
	return &Mirror{entries: map[string]*FeedEntry{}, byUser: map[string]*FeedEntry{}}
}

// Since is what to ask the room's Changes for next: the incarnation and version the mirror
// has.
func (m *Mirror) Since() (room string, version uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.f.Room, m.f.Version
}

// Applied is when the last feed was applied; the zero time before the first.
func (m *Mirror) Applied() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.at
}

// Len is how many entries the mirror holds.
func (m *Mirror) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// Apply brings the mirror to f, applied at at: a full feed replaces every entry, another one
// updates the entries it carries (and forgets the gone ones). A feed of another incarnation
// that is not full is ignored (the mirror asks again and gets a full one).
func (m *Mirror) Apply(f Feed, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !f.Full && f.Room != m.f.Room {
		return
	}
	if f.Full {
		clear(m.entries)
		clear(m.byUser)
	}
	for i := range f.Entries {
		e := f.Entries[i]
		if old := m.entries[e.ID]; old != nil && m.byUser[old.User] == old {
			delete(m.byUser, old.User)
		}
		if e.Gone {
			delete(m.entries, e.ID)
			continue
		}
		m.entries[e.ID] = &e
		if u := m.byUser[e.User]; u == nil || u.State == Expired || !e.State.Final() {
			m.byUser[e.User] = &e
		}
	}
	f.Entries = nil
	m.f, m.at = f, at
}

// Get answers entry id as of now, as Room.Get would have at the last feed; false when the
// mirror does not hold it (not in a feed yet, or dropped).
func (m *Mirror) Get(id string, now time.Time) (Entry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok {
		return Entry{}, false
	}
	return m.view(e, now), true
}

// Lookup answers user's entry as Room.Lookup would have at the last feed.
func (m *Mirror) Lookup(user string, now time.Time) (Entry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.byUser[user]
	if !ok {
		return Entry{}, false
	}
	return m.view(e, now), true
}

// view is Room.view of a fed entry.
func (m *Mirror) view(e *FeedEntry, now time.Time) Entry {
	v := Entry{ID: e.ID, User: e.User, State: e.State, ExpiresAt: e.ExpiresAt, Region: e.Region, Reason: e.Reason}
	switch {
	case e.State == Queued && !m.f.Opened:
		if m.f.OpensAt.After(now) {
			v.EstimatedWait = m.f.OpensAt.Sub(now)
		}
	case e.State == Queued:
		v.Position = int(e.Seq-m.f.Head) + 1 + m.f.Binding
		v.EstimatedWait = durationOf(float64(v.Position) / m.f.FlowRate)
	case e.State == Admitted && !now.Before(e.ExpiresAt):
		v.State = Expired
	}
	return v
}
