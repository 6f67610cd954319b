package admission

import (
	"container/heap"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// Defaults of WaitlistConfig.
const (
	// DefaultOfferTTL is how long a waitlist offer sets its units aside.
	DefaultOfferTTL = 3 * time.Minute
	// DefaultMaxEntries is how many entries a waitlist keeps at most.
	DefaultMaxEntries = 100000
)

// WaitlistConfig configures a Waitlist. Zero OfferTTL, MaxEntries and NewID take their
// defaults.
type WaitlistConfig struct {
	Sale, SKU, Region string
	// OfferTTL is how long an offer sets its units aside. Default DefaultOfferTTL.
	OfferTTL time.Duration
	// MaxEntries bounds the entries kept (waiting, offered and final ones retained 2×OfferTTL);
	// past it Join answers an *apierr.OverloadedError. Default DefaultMaxEntries.
	MaxEntries int
	// NewID makes entry ids (the offers' admission ids); default 32 hex characters from
	// crypto/rand.
	NewID func() string
}

// Offer sets Units aside for the waitlist entry ID's User until Expires; the caller signs a
// ticket for it (Ticket.SKU set).
type Offer struct {
	ID, User string
	Units    int
	Expires  time.Time
}

// Waitlist is the line, per sale and SKU at one region, for units that come back after the
// SKU sold out: buyers Join in order; Offer gives returned units to the heads of the line;
// an offer ends Used when Claimed or Expired when its time passes, and the units it set
// aside go back through Expire to be offered to the next buyers.
//
// The units set aside stay units of the pool: the caller keeps them available and only gates
// who may take them. SetAside is always the sum of the outstanding offers' units. Entries:
// Queued (with Position), Admitted (an offer is out: ExpiresAt and Units), then Used or
// Expired, final and kept at least 2×OfferTTL. A Waitlist is safe for concurrent use.
type Waitlist struct {
	cfg WaitlistConfig

	mu       sync.Mutex
	clock    time.Time // the latest now seen
	entries  map[string]*lineEntry
	byUser   map[string]*lineEntry
	line     entryLine
	offers   entryExpiries // outstanding offers by expiry
	setAside int
	returned int // units of offers ended since the last Expire, owed to its answer
	finals   entryDeque
	arriving map[string]bool // users whose Arrive is not settled yet
}

// NewWaitlist validates cfg, naming the bad field, and makes its waitlist.
func NewWaitlist(cfg WaitlistConfig) (*Waitlist, error) {
	switch {
	case strings.TrimSpace(cfg.Sale) == "":
		return nil, apierr.Invalid("sale", "empty")
	case strings.TrimSpace(cfg.SKU) == "":
		return nil, apierr.Invalid("sku", "empty")
	case strings.TrimSpace(cfg.Region) == "":
		return nil, apierr.Invalid("region", "empty")
	case cfg.OfferTTL < 0:
		return nil, apierr.Invalid("offer_ttl", "%s is negative", cfg.OfferTTL)
	case cfg.MaxEntries < 0:
		return nil, apierr.Invalid("max_entries", "%d is negative", cfg.MaxEntries)
	}
	if cfg.OfferTTL == 0 {
		cfg.OfferTTL = DefaultOfferTTL
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.NewID == nil {
		cfg.NewID = randomEntryID
	}
	return &Waitlist{cfg: cfg, entries: make(map[string]*lineEntry), byUser: make(map[string]*lineEntry),
		arriving: make(map[string]bool)}, nil
}

// Join puts user at the back of the line. A user already waiting, holding an offer, or whose
// offer was claimed gets that entry back; one whose offer expired joins again at the back.
// Past MaxEntries it answers an *apierr.OverloadedError. Join ends the offers past their
// expiry (their units are owed to the next Expire). Join is Arrive and Settle at once.
func (w *Waitlist) Join(user string, now time.Time) (Entry, error) {
	e, a, err := w.Arrive(user, now)
	if err != nil || a == nil {
		return e, err
	}
	return w.Settle(a, true, now), nil
}

// Arrive is Join's first half, as Room.Arrive is Enter's: it answers the entry user has
// (Arrival nil) or keeps a place for a new one, counted against MaxEntries, to be settled
// once the caller has recorded it.
func (w *Waitlist) Arrive(user string, now time.Time) (Entry, *Arrival, error) {
	if user == "" {
		return Entry{}, nil, apierr.Invalid("user", "empty")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.observe(now)
	w.expire(now)
	if e, ok := w.byUser[user]; ok && e.state != Expired {
		return w.view(e, now), nil, nil
	}
	if w.arriving[user] {
		return Entry{}, nil, fmt.Errorf("%w: buyer %s is joining the waitlist of sale %s sku %s already",
			apierr.ErrAborted, user, w.cfg.Sale, w.cfg.SKU)
	}
	if !makeSpace(len(w.entries)+len(w.arriving), w.cfg.MaxEntries, &w.finals, 2*w.cfg.OfferTTL, now, w.drop) {
		return Entry{}, nil, overloaded(fmt.Sprintf("waitlist of sale %s sku %s at %s", w.cfg.Sale, w.cfg.SKU,
			w.cfg.Region), &w.finals, 2*w.cfg.OfferTTL, now)
	}
	a := &Arrival{ID: w.cfg.NewID(), User: user}
	if _, dup := w.entries[a.ID]; dup || a.ID == "" {
		panic(fmt.Sprintf("admission: NewID made an empty or duplicate id %q", a.ID))
	}
	w.arriving[user] = true
	return Entry{}, a, nil
}

// Settle is Join's second half: with ok, a's entry joins the back of the line and is
// answered; without, the place is let go. Settle a given Arrival once.
func (w *Waitlist) Settle(a *Arrival, ok bool, now time.Time) Entry {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.arriving[a.User] {
		panic(fmt.Sprintf("admission: waitlist arrival %s of %s settled twice", a.ID, a.User))
	}
	delete(w.arriving, a.User)
	if !ok {
		return Entry{}
	}
	e := &lineEntry{id: a.ID, user: a.User, state: Queued}
	w.entries[e.id] = e
	w.byUser[e.user] = e
	w.line.pushBack(e)
	return w.view(e, now)
}

// Restore fills a waitlist that has no entry yet with stored ones (Stored; Pre is
// ignored), as of now: queued ones in their order, offers out until they expire, their
// units set aside, and final ones kept as ended now. A user with several entries keeps the
// last one: an earlier one still queued or offered is restored Expired, its units not set
// aside.
func (w *Waitlist) Restore(entries []Stored, now time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.entries) > 0 || len(w.arriving) > 0 {
		return fmt.Errorf("waitlist of sale %s sku %s restored with entries: %w", w.cfg.Sale, w.cfg.SKU, apierr.ErrConflict)
	}
	w.observe(now)
	last := lastOfUsers(entries)
	for i, s := range entries {
		e, err := restoredEntry(endedEarlier(s, i, last), w.entries)
		if err != nil {
			return err
		}
		if e.state == Admitted && e.units <= 0 {
			return apierr.Invalid("units", "%d in offer %s is not positive", e.units, e.id)
		}
		w.entries[e.id], w.byUser[e.user] = e, e
		switch e.state {
		case Queued:
			w.line.pushBack(e)
		case Admitted:
			heap.Push(&w.offers, e)
			w.setAside += e.units
		default:
			st := e.state
			e.state = Admitted // finish moves it from an offer
			w.finish(e, st)
		}
	}
	w.expire(now)
	return nil
}

// Get reads an entry as of now, changing nothing: an offer past its expiry reads Expired
// before the next Join or Expire records it.
func (w *Waitlist) Get(id string, now time.Time) (Entry, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.entries[id]
	if !ok {
		return Entry{}, false
	}
	return w.view(e, now), true
}

// PlanOffers answers what Offer(units, perBuyer, now) would offer, changing nothing: a caller
// that records offers before they are made plans them, records them, then makes each one
// recorded (OfferPlanned).
func (w *Waitlist) PlanOffers(units int, perBuyer int, now time.Time) []Offer {
	perBuyer = max(perBuyer, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Offer
	for i := 0; units > 0 && i < w.line.len(); i++ {
		e := w.line.q.at(i)
		n := min(units, perBuyer)
		units -= n
		out = append(out, Offer{ID: e.id, User: e.user, Units: n, Expires: now.Add(w.cfg.OfferTTL)})
	}
	return out
}

// Offer gives units that came back to the heads of the line, up to perBuyer each (a
// perBuyer below 1 counts as 1), each offer expiring OfferTTL after now, and answers the
// offers made, in line order; their units are set aside. Units beyond what the line takes
// are the caller's to release to everyone.
func (w *Waitlist) Offer(units int, perBuyer int, now time.Time) []Offer {
	perBuyer = max(perBuyer, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.observe(now)
	var out []Offer
	for units > 0 && w.line.len() > 0 {
		e := w.line.popFront()
		e.state, e.units, e.expires = Admitted, min(units, perBuyer), now.Add(w.cfg.OfferTTL)
		heap.Push(&w.offers, e)
		w.setAside += e.units
		units -= e.units
		out = append(out, Offer{ID: e.id, User: e.user, Units: e.units, Expires: e.expires})
	}
	return out
}

// OfferPlanned makes the offer o, one PlanOffers answered, once its caller has recorded it:
// its entry leaves the line wherever it now stands (an offer planned ahead of it may not have
// been recorded, and its buyer still waits first) and its units are set aside. It reports
// whether it made the offer: not when o has no units or its entry no longer waits (the
// offer was made already).
func (w *Waitlist) OfferPlanned(o Offer) bool {
	if o.Units <= 0 {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.entries[o.ID]
	if !ok || e.state != Queued {
		return false
	}
	w.line.remove(e)
	e.state, e.units, e.expires = Admitted, o.Units, o.Expires
	heap.Push(&w.offers, e)
	w.setAside += e.units
	return true
}

// Claimed records that the buyer reserved units with the offer id (a ticket backs one
// reservation): the offer ends Used and none of its units stay set aside; those it offered
// beyond units are owed to the next Expire's answer, to be offered again. Unknown ids and
// entries without an outstanding offer are ignored, so repeating it changes nothing.
func (w *Waitlist) Claimed(id string, units int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.entries[id]
	if !ok || e.state != Admitted {
		return
	}
	heap.Remove(&w.offers, e.heapIdx)
	w.setAside -= e.units
	w.returned += e.units - min(max(units, 0), e.units)
	w.finish(e, Used)
}

// Expire ends the offers past their expiry (entry Expired) and answers the units no longer
// set aside since the last Expire: those of the offers ended here or by Join, and the
// unclaimed rest of claimed offers. The caller offers them to the next buyers, or releases
// them to everyone when the line is empty.
func (w *Waitlist) Expire(now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.observe(now)
	w.expire(now)
	n := w.returned
	w.returned = 0
	return n
}

// SetAside answers the units set aside for the outstanding offers.
func (w *Waitlist) SetAside() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.setAside
}

// Len answers how many buyers are still waiting (Queued).
func (w *Waitlist) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.line.len()
}

func (w *Waitlist) observe(now time.Time) {
	if now.After(w.clock) {
		w.clock = now
	}
}

func (w *Waitlist) expire(now time.Time) {
	for len(w.offers) > 0 && !now.Before(w.offers[0].expires) {
		e := heap.Pop(&w.offers).(*lineEntry)
		w.setAside -= e.units
		w.returned += e.units
		w.finish(e, Expired)
	}
}

func (w *Waitlist) finish(e *lineEntry, s EntryState) {
	if e.state != Admitted || !s.Final() {
		panic(fmt.Sprintf("admission: waitlist entry %s cannot go from %s to %s", e.id, e.state, s))
	}
	e.state, e.finalAt = s, w.clock
	w.finals.pushBack(e)
}

func (w *Waitlist) drop(e *lineEntry) {
	delete(w.entries, e.id)
	if w.byUser[e.user] == e {
		delete(w.byUser, e.user)
	}
}

func (w *Waitlist) view(e *lineEntry, now time.Time) Entry {
	v := Entry{ID: e.id, User: e.user, State: e.state, ExpiresAt: e.expires, Units: e.units}
	switch {
	case e.state == Queued:
		v.Position = w.line.position(e)
	case e.state == Admitted && !now.Before(e.expires):
		v.State = Expired
	}
	return v
}
