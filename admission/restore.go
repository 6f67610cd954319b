package admission

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// Stored is an entry as its caller recorded it, for Restore: the durable part of a room's or
// a waitlist's entry. Restore takes them in the order they were recorded (the order of
// arrival at the region).
type Stored struct {
	ID, User string
	// Pre says the entry arrived in the room's pre-queue.
	Pre bool
	// State is Queued, Admitted (ExpiresAt set; Units too for a waitlist offer), or a
	// final state: Used, Expired, Elsewhere (with Region).
	State     EntryState
	ExpiresAt time.Time
	Region    string
	Units     int
}

// Restore fills a room that has no entry yet with stored ones, as of now: a leader taking
// over a region's line. The pre-queue's draw is made again from every pre-queue entry (the
// same draw: the same entries and seed), then the later arrivals follow in their order;
// admitted entries count against MaxLive until they expire; final ones are kept as ended
// now. A user with several entries keeps the last one: an earlier one still queued or
// admitted is restored Expired (endedEarlier), so it neither waits nor holds a live place.
func (r *Room) Restore(entries []Stored, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) > 0 || len(r.arriving) > 0 {
		return fmt.Errorf("room of sale %s restored with entries: %w", r.cfg.Sale, apierr.ErrConflict)
	}
	r.observe(now)
	last := lastOfUsers(entries)
	for i, s := range entries {
		e, err := restoredEntry(endedEarlier(s, i, last), r.entries)
		if err != nil {
			return err
		}
		r.entries[e.id], r.byUser[e.user] = e, e
		r.touch(e)
		switch {
		case e.pre:
			r.pre = append(r.pre, e)
		case e.state == Queued:
			r.post = append(r.post, e)
		}
		switch e.state {
		case Queued:
		case Admitted:
			r.live++
			heap.Push(&r.tickets, e)
		default:
			st := e.state
			e.state = Queued // finish moves it from a live state
			r.finish(e, st)
		}
	}
	if !now.Before(r.cfg.OpensAt) {
		r.open()
	}
	r.expire(now)
	return nil
}

// restoredEntry checks one stored entry and makes its lineEntry.
func restoredEntry(s Stored, have map[string]*lineEntry) (*lineEntry, error) {
	switch {
	case s.ID == "" || have[s.ID] != nil:
		return nil, apierr.Invalid("id", "%q is empty or repeated", s.ID)
	case s.User == "":
		return nil, apierr.Invalid("user", "empty in entry %s", s.ID)
	case s.State == Admitted && s.ExpiresAt.IsZero():
		return nil, apierr.Invalid("expires_at", "unset in admitted entry %s", s.ID)
	case !slices.Contains([]EntryState{Queued, Admitted, Used, Expired, Elsewhere}, s.State):
		return nil, apierr.Invalid("state", "%q cannot be restored (entry %s)", s.State, s.ID)
	}
	return &lineEntry{id: s.ID, user: s.User, state: s.State, pre: s.Pre, expires: s.ExpiresAt, region: s.Region,
		units: s.Units}, nil
}

// lastOfUsers answers, per user, the index of their last entry among entries.
func lastOfUsers(entries []Stored) map[string]int {
	last := make(map[string]int, len(entries))
	for i, s := range entries {
		last[s.User] = i
	}
	return last
}

// endedEarlier is s, the i-th of the entries whose users' last indexes are last, as Restore
// takes it: a user keeps only their last entry, so an earlier one not final (queued or
// admitted: two rows for one buyer) is taken as Expired.
func endedEarlier(s Stored, i int, last map[string]int) Stored {
	if last[s.User] != i && !s.State.Final() {
		s.State = Expired
	}
	return s
}

// stamp formats t as the API does: RFC 3339 in UTC with milliseconds.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }
