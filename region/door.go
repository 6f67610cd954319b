package region

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// DoorConfig configures a region's front door: the waiting rooms of its sales with a
// waiting room, the tickets they issue, and the binding of each admitted buyer to this
// region.
type DoorConfig struct {
	// Keys returns the cluster's ticket keys as last read; required.
	Keys func() *admission.Keyring
	// Bind records, once per (sale, user) across the cluster, the region a buyer is bound to,
	// and returns the region recorded (this one, or the one that came first). It is what makes
	// the per-user limit hold across regions. Nil: no binding (a cluster of one region).
	Bind func(ctx context.Context, sale, user, region string) (string, error)
	// PerUserRate and PerUserBurst bound how often one buyer may enter (token bucket); the
	// defaults are 2 per second, 5 at once.
	PerUserRate  float64
	PerUserBurst int
	// PerAddressRate and PerAddressBurst bound how often one client address may enter; the
	// defaults are 50 per second, 200 at once.
	PerAddressRate  float64
	PerAddressBurst int
	// MaxBuckets bounds each limiter's buckets (admission.Limiter); default 200,000.
	MaxBuckets int
	// MaxQueue bounds each room's entries; default admission.DefaultMaxQueue.
	MaxQueue int
	// Tick is how often the rooms admit the buyers due; default 10ms.
	Tick time.Duration
	// BindsInFlight bounds the binding writes under way at once; default 64.
	BindsInFlight int
	// BindWait is how long an admission waits for the binding of a buyer the region does not
	// know before it admits them and lets the binding finish in the background (doorbind.go);
	// default 20ms. Only for a region that binds (Config.Binding).
	BindWait time.Duration
	// Logger receives operational messages; default the region's.
	Logger *slog.Logger
}

func (c *DoorConfig) validate(r *Region) error {
	if c.Keys == nil {
		return errors.New("door: Keys is required")
	}
	setDefault(&c.PerUserRate, 2)
	setDefault(&c.PerUserBurst, 5)
	setDefault(&c.PerAddressRate, 50)
	setDefault(&c.PerAddressBurst, 200)
	setDefault(&c.MaxBuckets, 200_000)
	setDefault(&c.MaxQueue, admission.DefaultMaxQueue)
	setDefault(&c.Tick, 10*time.Millisecond)
	setDefault(&c.BindsInFlight, 64)
	setDefault(&c.BindWait, 20*time.Millisecond)
	if c.BindWait < 0 || c.BindWait > bindTimeout {
		return fmt.Errorf("door: bind wait %s: must be 0..%s", c.BindWait, bindTimeout)
	}
	if c.Logger == nil {
		c.Logger = r.cfg.Logger
	}
	return nil
}

func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Door is a region's front door for storefronts: the waiting room of each sale it leads,
// admission tickets, and reservations made with them. It owns one goroutine, which admits
// the buyers due in every room; Close stops it.
type Door struct {
	r     *Region
	cfg   DoorConfig
	gates gates
	binds chan struct{} // a slot per binding write in flight
	later chan struct{} // a slot per binding after an admission in flight (bindLater)
	mu    sync.Mutex
	rooms map[string]*saleRoom
	// offers are its waitlist half: the sold-out SKUs' waitlists (waitlist.go).
	offers offers
	// epoch is the term whose lines rooms and waitlists hold (0: none loaded); loadMu is
	// held while a term's lines load (lineload.go).
	epoch  int64
	loadMu sync.Mutex
	// line writes the entries before anyone hears of them (line.go).
	line     *lineWriter
	cancel   context.CancelFunc
	done     chan struct{}
	closeOne sync.Once
	// reads are its answers about the lines that change nothing: the polls, counted (Polls),
	// and LineChanges, whose calls are held until their line changes (linewait.go).
	reads lineReads
}

// NewDoor opens r's front door and starts its admitting goroutine.
func NewDoor(r *Region, cfg DoorConfig) (*Door, error) {
	if err := cfg.validate(r); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Door{r: r, cfg: cfg, rooms: map[string]*saleRoom{}, cancel: cancel, done: make(chan struct{}),
		gates: gates{r: r, users: admission.NewLimiter(cfg.PerUserRate, cfg.PerUserBurst, cfg.MaxBuckets),
			addrs: admission.NewLimiter(cfg.PerAddressRate, cfg.PerAddressBurst, cfg.MaxBuckets)},
		binds: make(chan struct{}, cfg.BindsInFlight), later: make(chan struct{}, maxBindsLater), line: newLineWriter(r.pool, cfg.Logger, r.stepDownTerm)}
	d.offers = offers{d: d, lists: map[poolKey]*saleWaitlist{}}
	d.reads.d = d
	go d.run(ctx)
	return d, nil
}

// Close stops admitting, waits for the bindings under way, then stops the line's writer;
// idempotent.
func (d *Door) Close() {
	d.closeOne.Do(func() {
		d.cancel()
		<-d.done
		d.line.close()
	})
}

// Admission is one buyer's place in a sale's waiting room at this region, as the buyer is
// told it: while queued, the position and an estimate; once admitted, the ticket.
type Admission struct {
	admission.Entry
	Sale   string
	Ticket string
	// SKU is set on a waitlist's admission: its ticket takes units of that SKU only.
	SKU string
}

// Enter puts user in sale's waiting room, or returns the place they have (never a second
// one). Addr is the client's address for the per-address limit ("" for none). Refused: a
// sale without a waiting room (CONFLICT), a sale sold out everywhere (SOLD_OUT) or paused
// (PAUSED), a buyer bound to another region (BOUND_ELSEWHERE, naming it), or a buyer or
// address knocking too often (OVERLOADED with a retry-after).
func (d *Door) Enter(ctx context.Context, sale, user, addr string) (Admission, error) {
	if err := checkIDs("sale_id", sale, "user_id", user); err != nil {
		return Admission{}, err
	}
	if addr != "" {
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return Admission{}, apierr.Invalid("client_address", "not an IP address")
		}
		addr = limiterKey(ip)
	}
	now := d.r.cfg.Clock.Now()
	if err := d.gates.limit(user, addr, now); err != nil {
		return Admission{}, err
	}
	sr, t, err := d.room(ctx, sale)
	if err != nil {
		return Admission{}, err
	}
	room := sr.room
	// Entering again answers the place the buyer has, even while the room admits no one: a
	// storefront whose answer was lost gets the live ticket back.
	if e, ok := room.Lookup(user, now); ok && e.State != admission.Expired {
		if err := d.gates.closed(t); err != nil && !e.State.Final() && e.State != admission.Admitted {
			return Admission{}, err
		}
		return d.answer(sale, e)
	}
	if err := d.gates.closed(t); err != nil {
		return Admission{}, err
	}
	e, a, err := room.Arrive(user, now)
	if ee := (*admission.EnteringError)(nil); errors.As(err, &ee) {
		return enteredMeanwhile(ctx, d, sale, room, ee)
	}
	if err != nil {
		return Admission{}, err
	}
	if a != nil { // a new place: taken once its row is committed
		e, err = d.recordArrival(ctx, sr.epoch, sale, "", a, now, func(ok bool) admission.Entry {
			return room.Settle(a, ok, d.r.cfg.Clock.Now())
		})
		if err != nil {
			return Admission{}, err
		}
	}
	return d.answer(sale, e)
}

// enteredMeanwhile answers an Enter that came while the same buyer's earlier one was being
// recorded: the place that one took, once it settled (never a second place); ABORTED, to ask
// again, if it took none or ctx ends first.
func enteredMeanwhile(ctx context.Context, d *Door, sale string, room *admission.Room, ee *admission.EnteringError) (Admission, error) {
	select {
	case <-ee.Done:
	case <-ctx.Done():
		return Admission{}, fmt.Errorf("%w (waiting for it: %v)", ee, ctx.Err())
	}
	if e, ok := room.Lookup(ee.User, d.r.cfg.Clock.Now()); ok && e.State != admission.Expired {
		return d.answer(sale, e)
	}
	return Admission{}, ee
}

// recordArrival writes a new entry's row (line.go) and answers the entry settle makes once
// the row's batch is done (ok: committed).
func (d *Door) recordArrival(ctx context.Context, epoch int64, sale, sku string, a *admission.Arrival, now time.Time,
	settle func(ok bool) admission.Entry) (admission.Entry, error) {
	var e admission.Entry
	err := d.line.record(ctx, &lineReq{epoch: epoch, insert: true,
		row:    lineRow{sale: sale, id: a.ID, user: a.User, sku: sku, pre: a.Pre, at: now},
		settle: func(err error) { e = settle(err == nil) }})
	return e, err
}

// GetAdmission polls an admission: memory only, no SQL (but a sale's terms, once, when this
// leader has no room of the sale yet).
func (d *Door) GetAdmission(ctx context.Context, sale, id string) (Admission, error) {
	d.reads.polls.Add(1)
	if err := checkIDs("sale_id", sale, "admission_id", id); err != nil {
		return Admission{}, err
	}
	sr, t, err := d.room(ctx, sale)
	if err != nil {
		return Admission{}, err
	}
	return pollIn(d, sr, t, id)
}

// PollAdmission is GetAdmission for callers no certificate vouches for (the waiting-room
// page's public listener): from memory only, never the database, so a poll naming any sale
// id costs no query. A sale whose room this leader does not hold has no such admission.
func (d *Door) PollAdmission(ctx context.Context, sale, id string) (Admission, error) {
	d.reads.polls.Add(1)
	if err := checkIDs("sale_id", sale, "admission_id", id); err != nil {
		return Admission{}, err
	}
	if _, err := d.ensureLoaded(ctx); err != nil { // once per term: the line's load
		return Admission{}, err
	}
	d.mu.Lock()
	sr := d.rooms[sale]
	d.mu.Unlock()
	if sr == nil {
		return Admission{}, apierr.NotFound("admission_id", id)
	}
	return pollIn(d, sr, sr.terms, id)
}

// pollIn answers a poll of admission id in sale's room sr (terms t), or of a waitlist's offer.
func pollIn(d *Door, sr *saleRoom, t SaleTerms, id string) (Admission, error) {
	room, sale := sr.room, sr.sale
	if e, ok := room.Get(id, d.r.cfg.Clock.Now()); ok && !e.State.Final() {
		if err := d.gates.closed(t); err != nil && e.State != admission.Admitted {
			return Admission{}, err
		}
	}
	now := d.r.cfg.Clock.Now()
	if e, ok := room.Get(id, now); ok {
		return d.answer(sale, e)
	}
	if wl, e, ok := d.offers.findOffer(sale, id, now); ok {
		return d.offers.answerWaitlist(sale, wl.pk.sku, e)
	}
	return Admission{}, apierr.NotFound("admission_id", id)
}

// Reserve makes a reservation (Region.Reserve) and, when a ticket made it, ends the
// ticket's admission: its live place is freed for the next buyer.
func (d *Door) Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error) {
	if req.token() != nil {
		// The rooms of this term first: the admission a ticket's hold uses is then ended in
		// the room (a load reading the holds before this one commits would miss it).
		if _, err := d.ensureLoaded(ctx); err != nil {
			return ReserveResult{}, err
		}
	}
	var offer *saleWaitlist
	if tok := req.token(); tok != nil && tok.Ticket.SKU != "" { // the region verifies it
		// An offer no longer out (claimed: this may be a retry) takes no set-aside units: the
		// region replays a retry, and refuses another key (the ticket's one use) or finds
		// only what is open to everyone.
		offer = d.offers.reserveOffer(&req, tok.Ticket)
	}
	res, err := d.r.Reserve(ctx, req)
	if err == nil && offer != nil {
		offer.list.Claimed(res.Hold.Admission, int(res.Hold.Quantity))
		return res, nil
	}
	if err == nil && res.Hold.Admission != "" {
		endAdmission(d, req.Sale, res.Hold.Admission)
	}
	return res, err
}

// answer turns a room's entry into what the buyer is told: a buyer bound elsewhere is an
// error (BOUND_ELSEWHERE, naming the region); an admitted one
// carries its ticket, signed now (a ticket is a pure function of the entry and the keys).
func (d *Door) answer(sale string, e admission.Entry) (Admission, error) {
	a := Admission{Entry: e, Sale: sale}
	switch e.State {
	case admission.Elsewhere:
		return a, &apierr.BoundError{Sale: sale, Region: e.Region}
	case admission.Used:
		// A ticket used before the buyer's binding answered another region (bindLater): its
		// holds were given back; the buyer is told where they are bound.
		if err := d.r.binds.elsewhere(sale, e.User); err != nil {
			return a, err
		}
	case admission.Admitted:
		tk, err := d.cfg.Keys().Sign(admission.Ticket{Sale: sale, User: e.User, Region: d.r.cfg.Name, Admission: e.ID, Expires: e.ExpiresAt})
		if err != nil {
			return a, fmt.Errorf("sign the ticket of admission %s: %w", e.ID, err)
		}
		a.Ticket = tk
	}
	return a, nil
}

// Reasons a room closes with; the first word is the answer's reason.
const (
	closedSoldOut = "SOLD_OUT"
	closedPaused  = "PAUSED"
)

func closedError(sale, reason string) error {
	if reason == closedPaused {
		return fmt.Errorf("sale %s is paused: its waiting room admits no one: %w", sale, ErrPaused)
	}
	return fmt.Errorf("sale %s is sold out in every region: %w", sale, ErrSoldOut)
}

// room returns sale's waiting room at this region, made on first use from the sale's terms,
// once the lines of this term are loaded. Only the leader has rooms: a standby answers
// NOT_LEADER.
func (d *Door) room(ctx context.Context, sale string) (*saleRoom, SaleTerms, error) {
	epoch, err := d.ensureLoaded(ctx)
	if err != nil {
		return nil, SaleTerms{}, err
	}
	t, err := d.r.terms(ctx, sale)
	if err != nil {
		return nil, t, err
	}
	if !t.Admission.Waiting() {
		return nil, t, fmt.Errorf("sale %s has no waiting room: reserve without a ticket: %w", sale, ErrConflict)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != epoch { // the term ended meanwhile
		return nil, t, d.r.notLeader()
	}
	if sr := d.rooms[sale]; sr != nil {
		return sr, t, nil
	}
	if len(d.rooms) >= MaxRooms {
		return nil, t, &apierr.OverloadedError{What: fmt.Sprintf("waiting rooms (%d sales)", MaxRooms), RetryAfter: time.Minute}
	}
	sr, err := d.makeRoom(t, epoch)
	if err != nil {
		return nil, t, err
	}
	d.rooms[sale] = sr
	return sr, t, nil
}

// newRoom makes sale's room for term epoch from its terms, nil when it has no waiting room.
func (d *Door) newRoom(ctx context.Context, sale string, epoch int64) (*saleRoom, error) {
	t, err := d.r.terms(ctx, sale)
	if err != nil {
		return nil, fmt.Errorf("sale %s: %w", sale, err)
	}
	if !t.Admission.Waiting() {
		return nil, nil
	}
	return d.makeRoom(t, epoch)
}

func (d *Door) makeRoom(t SaleTerms, epoch int64) (*saleRoom, error) {
	room, err := admission.NewRoom(admission.RoomConfig{Sale: t.Sale, Region: d.r.cfg.Name, OpensAt: t.OpensAt,
		Rate: float64(t.Admission.Rate), MaxLive: int(t.Admission.MaxLive), TicketTTL: t.Admission.TicketTTL,
		MaxQueue: d.cfg.MaxQueue, Seed: LotterySeed(t.Sale)})
	if err != nil {
		return nil, fmt.Errorf("sale %s: waiting room: %w", t.Sale, err)
	}
	return &saleRoom{room: room, sale: t.Sale, ticketTTL: t.Admission.TicketTTL, terms: t, epoch: epoch}, nil
}

// MaxRooms bounds the waiting rooms a region leader keeps, one per sale with a waiting room
// entered since it took the lead.
const MaxRooms = 256

// saleRoom is one sale's waiting room at this region, with what its admitting needs.
type saleRoom struct {
	room      *admission.Room
	sale      string
	ticketTTL time.Duration
	terms     SaleTerms
	epoch     int64 // the term it belongs to: its rows are written under it
}

// LotterySeed is the published seed of a sale's pre-queue shuffle: the FNV-1a hash of its id,
// so anyone can recompute the order the pre-queue was drawn in.
func LotterySeed(sale string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(sale))
	return h.Sum64()
}

// run admits the buyers due in every room, every Tick, until Close. At the start of each
// term it loads the lines (ensureLoaded) and from then on prunes their ended entries; when
// this process no longer leads, its rooms are dropped: the next leader loads them from the
// database (docs/storefront.md says what a failover keeps).
func (d *Door) run(ctx context.Context) {
	defer close(d.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(d.cfg.Tick)
	defer tick.Stop()
	var pruned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		epoch, err := d.ensureLoaded(ctx)
		if err != nil {
			if d.r.Leading() && ctx.Err() == nil {
				d.cfg.Logger.Warn("the waiting rooms cannot be loaded; trying again", "region", d.r.cfg.Name, "err", err)
			}
			d.mu.Lock()
			if d.epoch != 0 && !d.r.Leading() {
				d.rooms, d.offers.lists, d.epoch = map[string]*saleRoom{}, map[poolKey]*saleWaitlist{}, 0
			}
			d.mu.Unlock()
			d.reads.releaseAll()
			continue
		}
		if time.Since(pruned) >= pruneEvery {
			pruned = time.Now()
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the line's ended entries, bounded in time
			if n, err := d.prune(pctx, epoch, d.r.cfg.Clock.Now()); err != nil {
				d.cfg.Logger.Warn("pruning the waiting rooms' ended entries failed", "region", d.r.cfg.Name, "deleted", n, "err", err)
			}
			cancel()
		}
		d.offers.offerReturned(ctx, d.r.cfg.Clock.Now())
		d.mu.Lock()
		rooms := make([]*saleRoom, 0, len(d.rooms))
		for _, sr := range d.rooms {
			rooms = append(rooms, sr)
		}
		d.mu.Unlock()
		for _, sr := range rooms {
			d.admitDue(ctx, sr, &wg)
		}
		d.reads.releaseChanged(ctx)
	}
}

// admitDue binds each buyer the room has due to this region and admits them, or tells them
// where they are bound; a binding write that fails puts the buyer back at the front.
func (d *Door) admitDue(ctx context.Context, sr *saleRoom, wg *sync.WaitGroup) {
	room, now := sr.room, d.r.cfg.Clock.Now()
	if d.gates.salePaused(sr.sale) || d.gates.soldOutEverywhere(sr.terms) {
		return // no one is admitted while the sale is paused or gone; the line keeps its order
	}
	for _, e := range room.Due(now, cap(d.binds)) {
		select {
		case d.binds <- struct{}{}:
		case <-ctx.Done():
			if err := room.Requeue(e.ID); err != nil {
				d.cfg.Logger.Error("requeue at close", "admission", e.ID, "err", err)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-d.binds }()
			d.bind(ctx, sr, e, wg)
		}()
	}
}

// settled puts id back first in line when recording its admission failed (err from the
// writer), or logs an admission that changed under its binding (err from the room).
func (d *Door) settled(room *admission.Room, id string, err error) {
	if err == nil {
		return
	}
	if errors.Is(err, apierr.ErrConflict) {
		d.cfg.Logger.Error("admission changed under its binding", "admission", id, "err", err)
		return
	}
	d.requeue(room, id)
}

func (d *Door) requeue(room *admission.Room, id string) {
	if err := room.Requeue(id); err != nil {
		d.cfg.Logger.Error("requeue after a failed binding", "admission", id, "err", err)
	}
}

// SaleView is a sale as a storefront shows it: for display only; it decides nothing.
type SaleView struct {
	Terms      SaleTerms
	Region     string
	ServerTime time.Time
	Paused     bool
	SKUs       []SKUView
}

// SKUView is one SKU of a SaleView: sold out everywhere, paused, and this region's
// available count as of its last commit.
type SKUView struct {
	SKU       string
	SoldOut   bool
	Paused    bool
	Available transfer.Units
}

// Terms returns sale's terms as this region holds them (from memory once read): the
// waiting-room page reads the sale's room_return_url from them.
func (d *Door) Terms(ctx context.Context, sale string) (SaleTerms, error) {
	if err := checkIDs("sale_id", sale); err != nil {
		return SaleTerms{}, err
	}
	return d.r.terms(ctx, sale)
}

// Describe returns sale as a storefront shows it, from memory: the terms, whether it or each
// SKU is paused or sold out, and this region's counts as last committed.
func (d *Door) Describe(ctx context.Context, sale string) (SaleView, error) {
	if err := checkIDs("sale_id", sale); err != nil {
		return SaleView{}, err
	}
	t, err := d.r.terms(ctx, sale)
	if err != nil {
		return SaleView{}, err
	}
	v := SaleView{Terms: t, Region: d.r.cfg.Name, ServerTime: d.r.cfg.Clock.Now()}
	ps := d.r.paused.Load()
	paused := func(sku string) bool {
		if ps == nil {
			return false
		}
		_, ok := ps.reasons[poolKey{sale, sku}]
		return ok
	}
	v.Paused = paused("")
	for _, sku := range t.SKUs {
		avail, _ := d.r.cachedAvailable(poolKey{sale, sku})
		avail -= min(d.r.aside.of(poolKey{sale, sku}), avail) // what an open buyer could take
		v.SKUs = append(v.SKUs, SKUView{SKU: sku, SoldOut: d.r.cfg.Cluster.SoldOut != nil && d.r.cfg.Cluster.SoldOut(sale, sku),
			Paused: paused(sku), Available: avail})
	}
	return v, nil
}
