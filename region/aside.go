package region

import (
	"sync"

	"github.com/quotaworks/quota/transfer"
)

// asideBook is what a region's pools set aside for their waitlists: units that came back
// (a release, an expiry) while buyers were waiting for them are offered to those buyers
// before any open buyer may take them. The units stay in the pool's available count (I1
// counts them as any unit); the book only gates who may take them: an open buyer sees
// available − aside, a waitlist offer's ticket may take the aside units.
//
// The writer changes the book only with a batch's commit (batch.asideDelta, applied by
// Region.applyCommitted), so a failed batch sets nothing aside; the front door sets how many
// buyers wait per pool and gives back the units of offers that ended with no one left
// waiting. The book is the leader's memory: a new leader sets aside again the units of the
// offers it loads (lineload.go); units set aside and not yet offered go back to open buyers
// (docs/storefront.md).
type asideBook struct {
	mu      sync.Mutex
	aside   map[poolKey]transfer.Units
	waiting map[poolKey]int
}

func newAsideBook() *asideBook {
	return &asideBook{aside: map[poolKey]transfer.Units{}, waiting: map[poolKey]int{}}
}

// of returns the units pk has set aside.
func (a *asideBook) of(pk poolKey) transfer.Units {
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.aside[pk]
}

// waits reports whether buyers wait for pk's units.
func (a *asideBook) waits(pk poolKey) bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waiting[pk] > 0
}

// add changes pk's set-aside units by d, never below zero.
func (a *asideBook) add(pk poolKey, d transfer.Units) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v := max(a.aside[pk]+d, 0); v > 0 {
		a.aside[pk] = v
	} else {
		delete(a.aside, pk)
	}
}

// clamp sets aside at most available units of pk: a transfer's debit, which moves
// available units, may have taken some that were set aside.
func (a *asideBook) clamp(pk poolKey, available transfer.Units) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.aside[pk]; ok && v > available {
		if available > 0 {
			a.aside[pk] = available
		} else {
			delete(a.aside, pk)
		}
	}
}

// setWaiting records how many buyers wait for pk's units.
func (a *asideBook) setWaiting(pk poolKey, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > 0 {
		a.waiting[pk] = n
	} else {
		delete(a.waiting, pk)
	}
}

// reset forgets everything set aside at a takeover: the new leader sets aside again what its
// loaded waitlists offered (Door.install).
func (a *asideBook) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.aside)
	clear(a.waiting)
}

// asideNow is pk's set-aside units as this batch sees them: the committed book and the
// batch's own changes, at most the pool's available units.
func (b *batch) asideNow(pk poolKey, available transfer.Units) transfer.Units {
	return min(max(b.aside.of(pk)+b.asideDelta[pk], 0), available)
}

// setAsideReturned sets q returned units of pk aside when buyers wait for them. I1: the
// units are in available already (held → available); the book only gates who takes them.
func (b *batch) setAsideReturned(pk poolKey, q transfer.Units) {
	if b.aside.waits(pk) {
		b.asideDelta[pk] += q
	}
}
