package admission

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// A room's feed is what a Mirror needs to answer polls of the room's entries without asking
// the room: every change of an entry (its state, its place in line, its expiry) is logged
// under a version, and Room.Changes answers the entries changed since a version with the
// room's line counters (the front of the line, the entries being bound), from which a
// queued entry's position is computed the way Room.Get computes it. A mirror that is behind
// by more than the log keeps, or that follows another room (a new leader's: the room's
// incarnation changed), gets every entry at once (Feed.Full).

// FeedEntry is one entry as a feed carries it: what Room.Get shows of it, and its place in
// line (Seq) while queued. Gone says the room dropped it (a final entry past its retention).
type FeedEntry struct {
	ID, User string
	State    EntryState
	// Seq is the entry's place in line while queued and the line is drawn: its position is
	// Seq less the feed's Head, plus one, plus the entries being bound.
	Seq       int64
	ExpiresAt time.Time
	Region    string
	Reason    string
	Gone      bool
}

// Feed is a room's changes since a version (Room.Changes), with the line's counters as of
// Version.
type Feed struct {
	// Room is the room's incarnation: a mirror of another incarnation starts over.
	Room string
	// Version is the room's feed version these changes bring a mirror to.
	Version uint64
	// Full says Entries are all the room's entries: the mirror forgets what it had.
	Full bool
	// More says the changes were cut at the limit: ask again from Version.
	More bool
	// Opened says the pre-queue is drawn; Closed that the line ended (Reason).
	Opened, Closed bool
	Reason         string
	OpensAt        time.Time
	// Head is the Seq of the front of the line; Binding the entries being bound.
	Head    int64
	Binding int
	// FlowRate is the admissions per second the line moves at (EstimatedWait's divisor).
	FlowRate float64
	Entries  []FeedEntry
}

// feedLog is a room's log of changed entries: rec i was version from+i+1. It is cut (from
// set to the latest version) when it outgrows the room, so a mirror that far behind is sent
// everything again.
type feedLog struct {
	inc  string
	ver  uint64
	from uint64
	recs []feedRec
}

type feedRec struct {
	e   *lineEntry
	ver uint64
}

// minFeedLog is how many records the log keeps at least before it is cut.
const minFeedLog = 4096

func newFeedLog() feedLog {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand.Read crashes the program instead)
	return feedLog{inc: hex.EncodeToString(b[:])}
}

// touch logs a change of e; r.mu is held.
func (r *Room) touch(e *lineEntry) {
	f := &r.feed
	f.ver++
	e.ver = f.ver
	if len(f.recs) >= max(minFeedLog, 2*len(r.entries)) {
		f.recs, f.from = f.recs[:0], f.ver-1
	}
	f.recs = append(f.recs, feedRec{e: e, ver: f.ver})
}

// Incarnation is the room's feed identity (random, made with the room).
func (r *Room) Incarnation() string { return r.feed.inc }

// Changes answers the entries changed since version since of incarnation room (every
// entry, Full, when room is another one or since is no longer logged), at most limit of them
// (More: ask again from Version), with the line's counters as of now.
func (r *Room) Changes(room string, since uint64, limit int, now time.Time) Feed {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.counters(now)
	f := &r.feed
	if room != f.inc || since < f.from || since > f.ver {
		out.Full = true
		out.Entries = make([]FeedEntry, 0, len(r.entries))
		for _, e := range r.entries {
			out.Entries = append(out.Entries, feedEntry(e, false))
		}
		return out
	}
	for _, rec := range f.recs[since-f.from:] {
		if rec.e.ver != rec.ver { // changed again later: sent with its later record
			continue
		}
		if len(out.Entries) >= max(limit, 1) {
			out.Version, out.More = rec.ver-1, true
			break
		}
		out.Entries = append(out.Entries, feedEntry(rec.e, r.entries[rec.e.id] != rec.e))
	}
	return out
}

// Counters is Changes with no entries: the room's incarnation, version and line counters as
// of now. A feed whose Counters are unchanged brings a mirror nothing new.
func (r *Room) Counters(now time.Time) Feed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counters(now)
}

// counters is Counters; r.mu is held.
func (r *Room) counters(now time.Time) Feed {
	if !r.opened && !now.Before(r.cfg.OpensAt) {
		r.open() // as Get: the draw is made by whichever call first sees the opening
	}
	return Feed{Room: r.feed.inc, Version: r.feed.ver, Opened: r.opened, Closed: r.closed, Reason: r.reason,
		OpensAt: r.cfg.OpensAt, Head: r.line.head, Binding: r.binding, FlowRate: r.flowRate}
}

func feedEntry(e *lineEntry, gone bool) FeedEntry {
	return FeedEntry{ID: e.id, User: e.user, State: e.state, Seq: e.seq, ExpiresAt: e.expires, Region: e.region,
		Reason: e.reason, Gone: gone}
}
