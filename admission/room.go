package admission

import (
	"container/heap"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"math"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// Defaults of RoomConfig.
const (
	// DefaultPreQueue is how long before a sale opens its room takes arrivals.
	DefaultPreQueue = 10 * time.Minute
	// DefaultMaxQueue is how many entries a room keeps at most.
	DefaultMaxQueue = 200000
)

// EntryState is where a buyer's place in a waiting room or a waitlist stands.
type EntryState string

// The states of an Entry. Used, Expired, Elsewhere and Closed are final.
const (
	// Queued: waiting in line.
	Queued EntryState = "queued"
	// Binding: picked for admission; the caller is writing the cluster-wide binding record.
	Binding EntryState = "binding"
	// Admitted: a ticket (or a waitlist offer) is out and live.
	Admitted EntryState = "admitted"
	// Elsewhere: the buyer is bound to another region (Entry.Region); final.
	Elsewhere EntryState = "elsewhere"
	// Used: the ticket backed a reservation; final.
	Used EntryState = "used"
	// Expired: the ticket or offer expired unused; final.
	Expired EntryState = "expired"
	// Closed: the sale sold out or paused while the buyer waited (Entry.Reason); final.
	Closed EntryState = "closed"
)

// Final reports whether no transition leaves s.
func (s EntryState) Final() bool {
	switch s {
	case Queued, Binding, Admitted:
		return false
	}
	return true
}

// Entry is what a buyer sees of their place: in a Room or, with Units, in a Waitlist.
type Entry struct {
	ID    string
	User  string
	State EntryState
	// Position is the 1-based rank among queued entries, and in a room behind those being
	// bound too (Binding: they are at the front); 0 when not Queued, and 0 in a room's
	// pre-queue before the sale opens (the order is drawn at opening).
	Position int
	// EstimatedWait is a rough time until admission while Queued (see Room.Get); before
	// opening, the time until the sale opens. Always 0 in a waitlist.
	EstimatedWait time.Duration
	// ExpiresAt is the ticket's (or the offer's) expiry once admitted.
	ExpiresAt time.Time
	// Region is the region the buyer is bound to when Elsewhere.
	Region string
	// Reason says why the entry is Closed.
	Reason string
	// Units is what a waitlist offer sets aside for the buyer; 0 in a room.
	Units int
}

// RoomConfig configures a Room. Zero PreQueue, MaxQueue and NewID take their defaults.
type RoomConfig struct {
	Sale, Region string
	// OpensAt is when admissions start.
	OpensAt time.Time
	// PreQueue is how long before OpensAt arrivals are taken into the pre-queue; earlier
	// arrivals are refused with ErrNotOpen. Default DefaultPreQueue.
	PreQueue time.Duration
	// Rate is admissions per second, > 0.
	Rate float64
	// MaxLive bounds the tickets live at once (Binding and Admitted entries); > 0.
	MaxLive int
	// TicketTTL is how long a ticket lasts; > 0. Final entries are kept 2×TicketTTL.
	TicketTTL time.Duration
	// MaxQueue bounds the entries the room keeps (waiting, live and final ones retained);
	// past it Enter answers an *apierr.OverloadedError. Default DefaultMaxQueue. Size it
	// above the expected line plus 2×TicketTTL×Rate, the final entries being retained.
	MaxQueue int
	// Seed is the published seed of the pre-queue's shuffle.
	Seed uint64
	// NewID makes admission ids; default 32 hex characters from crypto/rand.
	NewID func() string
}

// RoomStats counts a room's entries.
type RoomStats struct {
	// Queued, Binding and Live (Admitted) are the entries in those states now.
	Queued, Binding, Live int
	// Used, Expired, Elsewhere and Closed count the entries that ever ended so, including
	// those since dropped.
	Used, Expired, Elsewhere, Closed int
	// Entries is how many entries the room keeps, bounded by MaxQueue.
	Entries int
}

// Room is a sale's waiting room at one region: buyers Enter, the caller's loop calls Due to
// pick the ones to admit at the configured rate and within MaxLive, binds each one cluster
// wide and reports the outcome (Admit, Elsewhere or Requeue), then Used when the ticket
// backs a reservation. Arrivals in the PreQueue window before OpensAt are shuffled from the
// published Seed at opening and placed ahead of later arrivals, who are served in order.
//
// Calls that take now (Enter, Due, Stats) also expire tickets past their expiry; Get only
// reads (but for the one-time draw of the pre-queue's order, done by whichever call first
// sees now >= OpensAt). A final entry is kept at least 2×TicketTTL after it ended (the
// room's latest now then, as Used and the like take none) and dropped only when the room is
// at MaxQueue and needs the space; Get of a dropped id answers false, and the user's next
// Enter gets a fresh entry. A Room is safe for concurrent use.
type Room struct {
	cfg      RoomConfig
	burst    float64 // token-bucket depth: a tenth of a second of Rate, at least 1
	flowRate float64 // admissions per second the line moves at: min(Rate, MaxLive/TicketTTL)

	mu      sync.Mutex
	clock   time.Time // the latest now seen
	opened  bool
	closed  bool
	reason  string
	entries map[string]*lineEntry
	byUser  map[string]*lineEntry
	pre     []*lineEntry // arrivals before opening, in arrival order
	post    []*lineEntry // arrivals after opens_at settled before the draw, in order
	// arriving are the users whose arrival is kept (Arrive) and not yet settled, pendingPre
	// how many of them join the pre-queue: no draw while there is one.
	arriving   map[string]chan struct{} // closed when the arrival settles
	pendingPre int
	line       entryLine
	tokens     float64
	filled     time.Time // when tokens were last refilled
	tickets    entryExpiries
	finals     entryDeque // final entries in the order they ended
	binding    int
	live       int
	ended      map[EntryState]int
	// feed is the log of changed entries a mirror follows (feed.go).
	feed feedLog
}

// lineEntry is a room's or waitlist's record of one entry.
type lineEntry struct {
	id, user string
	state    EntryState
	seq      int64 // place in line while Queued: see entryLine
	expires  time.Time
	region   string
	reason   string
	units    int  // a waitlist offer's units
	pre      bool // arrived in a room's pre-queue
	finalAt  time.Time
	heapIdx  int    // index in an entryExpiries while Admitted
	ver      uint64 // the room's feed version of the entry's last change (feed.go)
}

// NewRoom validates cfg, naming the bad field, and makes its room.
func NewRoom(cfg RoomConfig) (*Room, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.PreQueue == 0 {
		cfg.PreQueue = DefaultPreQueue
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.NewID == nil {
		cfg.NewID = randomEntryID
	}
	r := &Room{
		cfg:      cfg,
		burst:    max(1, cfg.Rate/10),
		flowRate: min(cfg.Rate, float64(cfg.MaxLive)/cfg.TicketTTL.Seconds()),
		entries:  make(map[string]*lineEntry),
		byUser:   make(map[string]*lineEntry),
		arriving: make(map[string]chan struct{}),
		filled:   cfg.OpensAt,
		ended:    make(map[EntryState]int),
		feed:     newFeedLog(),
	}
	r.tokens = r.burst
	return r, nil
}

func (c RoomConfig) validate() error {
	switch {
	case strings.TrimSpace(c.Sale) == "":
		return apierr.Invalid("sale", "empty")
	case strings.TrimSpace(c.Region) == "":
		return apierr.Invalid("region", "empty")
	case c.OpensAt.IsZero():
		return apierr.Invalid("opens_at", "unset")
	case c.PreQueue < 0:
		return apierr.Invalid("pre_queue", "%s is negative", c.PreQueue)
	case !(c.Rate > 0) || math.IsInf(c.Rate, 1):
		return apierr.Invalid("rate", "%v is not a positive number", c.Rate)
	case c.MaxLive <= 0:
		return apierr.Invalid("max_live", "%d is not positive", c.MaxLive)
	case c.TicketTTL <= 0:
		return apierr.Invalid("ticket_ttl", "%s is not positive", c.TicketTTL)
	case c.MaxQueue < 0:
		return apierr.Invalid("max_queue", "%d is negative", c.MaxQueue)
	}
	return nil
}

// Enter gives user their place. A user whose entry is not final (Queued, Binding, Admitted)
// gets that entry back, as does one whose entry ended Used, Elsewhere or Closed; one whose
// ticket expired gets a new place at the back. Before OpensAt-PreQueue it answers an error
// wrapping ErrNotOpen naming opens_at and server_time; after Close, a new user gets an
// Entry Closed with the reason and no id (nothing is kept). Past MaxQueue it answers an
// *apierr.OverloadedError. Enter is Arrive and Settle at once, for a room nothing records.
func (r *Room) Enter(user string, now time.Time) (Entry, error) {
	e, a, err := r.Arrive(user, now)
	if err != nil || a == nil {
		return e, err
	}
	return r.Settle(a, true, now), nil
}

// Arrival is a place a Room keeps for a new arrival between Arrive and Settle, while the
// caller records it durably: ID is the admission id it will have, and Pre says it joins the
// pre-queue (drawn at opening) rather than the back of the line.
type Arrival struct {
	ID, User string
	Pre      bool
}

// Arrive is Enter's first half. It answers the entry user has (Arrival nil), or the checks'
// error, or keeps a place for a new entry: the caller records the Arrival and then calls
// Settle once, with whether the record succeeded. A kept place counts against MaxQueue, and
// while a pre-queue arrival is kept the room does not draw its pre-queue, so a draw is
// always of every pre-queue arrival recorded before it. A second Arrive for a user whose
// arrival is kept answers an *EnteringError (wrapping apierr.ErrAborted): wait for its Done,
// then look the user up.
func (r *Room) Arrive(user string, now time.Time) (Entry, *Arrival, error) {
	if user == "" {
		return Entry{}, nil, apierr.Invalid("user", "empty")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observe(now)
	r.expire(now)
	if e, ok := r.byUser[user]; ok && e.state != Expired {
		return r.view(e, now), nil, nil
	}
	if r.closed {
		return Entry{User: user, State: Closed, Reason: r.reason}, nil, nil
	}
	if done := r.arriving[user]; done != nil {
		return Entry{}, nil, &EnteringError{User: user, Sale: r.cfg.Sale, Done: done}
	}
	if !r.opened && now.Before(r.cfg.OpensAt.Add(-r.cfg.PreQueue)) {
		return Entry{}, nil, fmt.Errorf("%w: sale %s at %s takes arrivals from %s: opens_at %s, server_time %s",
			apierr.ErrNotOpen, r.cfg.Sale, r.cfg.Region, stamp(r.cfg.OpensAt.Add(-r.cfg.PreQueue)),
			stamp(r.cfg.OpensAt), stamp(now))
	}
	if !now.Before(r.cfg.OpensAt) {
		r.open()
	}
	if !makeSpace(len(r.entries)+len(r.arriving), r.cfg.MaxQueue, &r.finals, 2*r.cfg.TicketTTL, now, r.drop) {
		return Entry{}, nil, overloaded(fmt.Sprintf("waiting room of sale %s at %s", r.cfg.Sale, r.cfg.Region),
			&r.finals, 2*r.cfg.TicketTTL, now)
	}
	a := &Arrival{ID: r.cfg.NewID(), User: user, Pre: !r.opened && now.Before(r.cfg.OpensAt)}
	if _, dup := r.entries[a.ID]; dup || a.ID == "" {
		panic(fmt.Sprintf("admission: NewID made an empty or duplicate id %q", a.ID))
	}
	r.arriving[user] = make(chan struct{})
	if a.Pre {
		r.pendingPre++
	}
	return Entry{}, a, nil
}

// EnteringError is Arrive's answer to a user whose earlier arrival is still being recorded:
// once Done is closed the arrival has settled, and Lookup answers the place it took, if any.
type EnteringError struct {
	User, Sale string
	Done       <-chan struct{}
}

func (e *EnteringError) Error() string {
	return fmt.Sprintf("buyer %s is entering sale %s already: %v", e.User, e.Sale, apierr.ErrAborted)
}

// Unwrap makes an EnteringError an apierr.ErrAborted: asked again, it answers the place.
func (e *EnteringError) Unwrap() error { return apierr.ErrAborted }

// Settle is Enter's second half: with ok, a's entry takes the place kept for it (the
// pre-queue, or the back of the line) and Settle answers it; without, the place is let go
// and Settle answers a zero Entry. Settle a given Arrival once.
func (r *Room) Settle(a *Arrival, ok bool, now time.Time) Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	done := r.arriving[a.User]
	if done == nil {
		panic(fmt.Sprintf("admission: arrival %s of %s settled twice", a.ID, a.User))
	}
	close(done)
	delete(r.arriving, a.User)
	if a.Pre {
		r.pendingPre--
	}
	r.observe(now)
	if !ok {
		r.openIfDue(now)
		return Entry{}
	}
	e := &lineEntry{id: a.ID, user: a.User, state: Queued, pre: a.Pre}
	r.entries[e.id] = e
	r.byUser[e.user] = e
	switch {
	case r.closed:
		e.reason = r.reason
		r.finish(e, Closed)
	case a.Pre:
		r.pre = append(r.pre, e)
	case r.opened:
		r.line.pushBack(e)
	default: // arrived after opens_at while the draw waited for a pre-queue arrival
		r.post = append(r.post, e)
	}
	r.touch(e)
	r.openIfDue(now)
	return r.view(e, now)
}

// openIfDue makes the draw once now is opens_at or later (one held up by an arrival being
// recorded happens when the arrival settles).
func (r *Room) openIfDue(now time.Time) {
	if !now.Before(r.cfg.OpensAt) {
		r.open()
	}
}

// Get reads an entry, with its Position and EstimatedWait as of now. It changes nothing but
// for the opening draw (see Room): an Admitted entry whose ticket has expired reads Expired
// before the next Enter, Due or Stats records it. EstimatedWait is Position over the rate
// the line moves at, min(Rate, MaxLive/TicketTTL): when the live cap binds, each ticket is
// taken to hold its place for its whole TTL, so the estimate errs long.
func (r *Room) Get(id string, now time.Time) (Entry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[id]
	if !ok {
		return Entry{}, false
	}
	if !r.opened && !now.Before(r.cfg.OpensAt) {
		r.open()
	}
	return r.view(e, now), true
}

// Lookup returns user's entry, if the room has one; like Get, it changes nothing.
func (r *Room) Lookup(user string, now time.Time) (Entry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byUser[user]
	if !ok {
		return Entry{}, false
	}
	return r.view(e, now), true
}

// Due advances the room to now: it expires the tickets past their expiry, then picks up to
// max entries from the front of the line and moves them to Binding, for the caller to bind
// and then Admit, Elsewhere or Requeue. It picks nothing before OpensAt or after Close, and
// no more than the token bucket allows (Rate per second, at most a tenth of a second of
// Rate and at least 1 at once) nor than MaxLive less the Binding and Admitted entries.
func (r *Room) Due(now time.Time, max int) []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observe(now)
	r.expire(now)
	if r.closed || now.Before(r.cfg.OpensAt) {
		return nil
	}
	r.open()
	if now.After(r.filled) {
		r.tokens = min(r.burst, r.tokens+now.Sub(r.filled).Seconds()*r.cfg.Rate)
		r.filled = now
	}
	n := min(max, r.cfg.MaxLive-r.binding-r.live, r.line.len())
	if float64(n) > r.tokens {
		n = int(r.tokens)
	}
	if n <= 0 {
		return nil
	}
	r.tokens -= float64(n)
	out := make([]Entry, 0, n)
	for range n {
		e := r.line.popFront()
		e.state = Binding
		r.binding++
		r.touch(e)
		out = append(out, r.view(e, now))
	}
	return out
}

// Stats counts the room's entries as of now, after expiring the tickets past their expiry.
func (r *Room) Stats(now time.Time) RoomStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observe(now)
	r.expire(now)
	if !r.opened && !now.Before(r.cfg.OpensAt) {
		r.open()
	}
	return RoomStats{
		Queued: len(r.pre) + len(r.post) + r.line.len(), Binding: r.binding, Live: r.live,
		Used: r.ended[Used], Expired: r.ended[Expired], Elsewhere: r.ended[Elsewhere], Closed: r.ended[Closed],
		Entries: len(r.entries),
	}
}

func (r *Room) observe(now time.Time) {
	if now.After(r.clock) {
		r.clock = now
	}
}

// open draws the pre-queue's order once, unless a pre-queue arrival is still being recorded
// (Arrive): sorted by user (so the order depends only on who arrived, not how their requests
// raced), then shuffled by a PCG seeded with Seed and the FNV-1a hash of Sale, and placed at
// the front of the line, followed by the arrivals after opens_at that settled meanwhile. The
// draw is of every pre-queue entry, whatever its state (a restored room's pre-queue holds
// those admitted since), and only the queued ones join the line.
func (r *Room) open() {
	if r.opened || r.pendingPre > 0 {
		return
	}
	r.opened = true
	sortByUser(r.pre)
	h := fnv.New64a()
	h.Write([]byte(r.cfg.Sale))
	rng := mrand.New(mrand.NewPCG(r.cfg.Seed, h.Sum64()))
	rng.Shuffle(len(r.pre), func(i, j int) { r.pre[i], r.pre[j] = r.pre[j], r.pre[i] })
	for _, e := range append(r.pre, r.post...) {
		if e.state == Queued {
			r.line.pushBack(e)
			r.touch(e)
		}
	}
	r.pre, r.post = nil, nil
}

func sortByUser(es []*lineEntry) {
	slices.SortFunc(es, func(a, b *lineEntry) int { return strings.Compare(a.user, b.user) })
}

// expire ends the Admitted entries whose ticket expiry is not after now.
func (r *Room) expire(now time.Time) {
	for len(r.tickets) > 0 && !now.Before(r.tickets[0].expires) {
		e := heap.Pop(&r.tickets).(*lineEntry)
		if e.state != Admitted {
			panic(fmt.Sprintf("admission: entry %s is %s among the live tickets", e.id, e.state))
		}
		r.live--
		r.finish(e, Expired)
	}
}

// finish moves e to the final state s and keeps it for the retention.
func (r *Room) finish(e *lineEntry, s EntryState) {
	if e.state.Final() || !s.Final() {
		panic(fmt.Sprintf("admission: entry %s cannot go from %s to %s", e.id, e.state, s))
	}
	e.state, e.finalAt = s, r.clock
	r.finals.pushBack(e)
	r.ended[s]++
	r.touch(e)
}

func (r *Room) lookup(id string) (*lineEntry, error) {
	e, ok := r.entries[id]
	if !ok {
		return nil, apierr.NotFound("admission", id)
	}
	return e, nil
}

func (r *Room) view(e *lineEntry, now time.Time) Entry {
	v := Entry{ID: e.id, User: e.user, State: e.state, ExpiresAt: e.expires, Region: e.region, Reason: e.reason}
	switch {
	case e.state == Queued && !r.opened:
		v.EstimatedWait = max(0, r.cfg.OpensAt.Sub(now))
	case e.state == Queued:
		// The entries being bound count ahead of every queued one: they left the line only in
		// this process's memory, and a leader taking over finds them queued at its front.
		v.Position = r.line.position(e) + r.binding
		v.EstimatedWait = durationOf(float64(v.Position) / r.flowRate)
	case e.state == Admitted && !now.Before(e.expires):
		v.State = Expired
	}
	return v
}

// durationOf converts seconds to a Duration, saturating.
func durationOf(secs float64) time.Duration {
	if secs >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(secs * float64(time.Second))
}

func conflict(e *lineEntry, what string) error {
	return fmt.Errorf("cannot %s entry %s: it is %s: %w", what, e.id, e.state, apierr.ErrConflict)
}

// drop forgets the final entry e.
func (r *Room) drop(e *lineEntry) {
	r.touch(e) // read as gone by the feed: no longer in entries
	delete(r.entries, e.id)
	if r.byUser[e.user] == e {
		delete(r.byUser, e.user)
	}
}

// makeSpace drops final entries older than retention, oldest first, while n entries are
// kept and n is at bound, and reports whether there is space for one more.
func makeSpace(n, bound int, finals *entryDeque, retention time.Duration, now time.Time,
	drop func(*lineEntry)) bool {
	for n >= bound && finals.len() > 0 && now.Sub(finals.front().finalAt) >= retention {
		drop(finals.popFront())
		n--
	}
	return n < bound
}

// overloaded says what is full and when its oldest final entry may be dropped.
func overloaded(what string, finals *entryDeque, retention time.Duration, now time.Time) error {
	retry := retention
	if finals.len() > 0 {
		retry = finals.front().finalAt.Add(retention).Sub(now)
	}
	return &apierr.OverloadedError{What: what, RetryAfter: max(retry, time.Second)}
}

// randomEntryID is the default NewID: 16 bytes from crypto/rand in hex.
func randomEntryID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand.Read crashes the program instead)
	return hex.EncodeToString(b[:])
}
