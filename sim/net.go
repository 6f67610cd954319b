package sim

import (
	"cmp"
	"slices"
	"time"
)

// message is one request or reply on its way.
type message struct {
	at       time.Time
	seq      int
	from, to string
	body     any
}

// network carries messages between processes. While faults are on it drops some, delays
// each by a random amount (which reorders them), duplicates some, and drops everything to
// or from a process whose links are cut.
type network struct {
	flying []message
	cut    map[string]time.Time // process → cut until
	due    []message            // deliverDue's scratch, reused step after step
}

const (
	dropRate = 0.05
	dupRate  = 0.03
	maxDelay = 300 * time.Millisecond
)

// send puts body on the wire from → to.
func (w *world) send(from, to string, body any) {
	if w.faults && (w.isCut(from) || w.isCut(to)) {
		w.stats.Faults["message cut"]++
		return
	}
	if w.faults && w.chance(dropRate) {
		w.stats.Faults["message dropped"]++
		return
	}
	delay := time.Millisecond
	if w.faults {
		delay = w.between(time.Millisecond, maxDelay)
	}
	w.net.flying = append(w.net.flying, message{at: w.now.Add(delay), seq: w.nextID(), from: from, to: to, body: body})
	if w.faults && w.chance(dupRate) {
		w.stats.Faults["message duplicated"]++
		w.net.flying = append(w.net.flying, message{at: w.now.Add(w.between(time.Millisecond, maxDelay)), seq: w.nextID(), from: from, to: to, body: body})
	}
}

func (w *world) isCut(name string) bool {
	until, ok := w.net.cut[name]
	return ok && w.now.Before(until)
}

// deliverDue hands every message whose time has come to its process, in time order.
func (n *network) deliverDue(w *world) {
	due := n.due[:0]
	rest := n.flying[:0] // filtered in place: each message is read before its slot is reused
	for _, m := range n.flying {
		if m.at.After(w.now) {
			rest = append(rest, m)
		} else {
			due = append(due, m)
		}
	}
	clear(n.flying[len(rest):]) // what was delivered is not kept alive by the backing array
	n.flying = rest
	slices.SortFunc(due, func(a, b message) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	for _, m := range due {
		if w.faults && (w.isCut(m.from) || w.isCut(m.to)) {
			w.stats.Faults["message cut"]++
			continue
		}
		w.receive(m)
	}
	clear(due)
	n.due = due[:0]
}

// receive dispatches a message to the process it is for.
func (w *world) receive(m message) {
	if r, ok := w.regions[m.to]; ok {
		r.receive(w, m)
		return
	}
	for _, c := range w.coords {
		if c.name == m.to {
			c.receive(w, m)
			return
		}
	}
	if m.to == storeName {
		w.store.receive(w, m)
	}
}
