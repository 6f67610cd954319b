// Package regionedge is a region's storefront edge (quotad edge): a process that serves the
// region's storefront HTTP API (regionhttp) without leading the region. It answers buyers'
// polls of the waiting line from a mirror of each sale's line (admission.Mirror) that it
// keeps from the leader's feed (RegionService/LineChanges), signs the tickets of admitted
// buyers with the cluster's ticket keys as the leader would, refuses a sale's sold-out or
// paused line itself, checks tickets' signatures, and forwards what must be decided
// (entering the line, reserving, confirming, releasing, the waitlist, the sale's page) to
// the region's current leader over gRPC (Upstream), following leadership changes itself.
// It can serve the region's waiting-room page too (regionhttp.ServeRoom: it is a
// regionhttp.RoomDoor). Its state is soft: it can be killed and restarted at any time, and any number can run
// (docs/storefront.md, "Edges").
package regionedge

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// Config configures an edge.
type Config struct {
	// Region is the region's name.
	Region string
	// Upstream calls the region's leader; required.
	Upstream *Upstream
	// Keys returns the cluster's ticket keys as last read; required.
	Keys func() *admission.Keyring
	// Refresh is how long after each answer a watched sale's line is fetched again from the
	// leader; default 250ms. A poll's answer is at most this much (and a round trip) older
	// than the leader's own.
	Refresh time.Duration
	// Wait is how long the leader may hold a fetch that would bring nothing new (a long poll,
	// answered as soon as the line changes: region.Door.LineChanges); default 2s, at most
	// region.MaxLineWait and half of MaxStale.
	Wait time.Duration
	// MaxStale is how old a line's last fetch may be for its polls to be answered from it;
	// past it (the leader unreachable that long) polls are forwarded. Default 30s: longer
	// than a failover, during which buyers keep hearing their place.
	MaxStale time.Duration
	// Idle is how long a sale no one asked about stays watched; default 2m.
	Idle time.Duration
	// FetchLimit bounds the entries of one fetch; default 50,000.
	FetchLimit int
	Logger     *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (c *Config) validate() error {
	if c.Upstream == nil || c.Keys == nil {
		return errors.New("edge: Upstream and Keys are required")
	}
	if why := transfer.CheckRegion(c.Region); why != "" {
		return apierr.Invalid("region", "%s", why)
	}
	if c.Refresh == 0 {
		c.Refresh = 250 * time.Millisecond
	}
	if c.MaxStale == 0 {
		c.MaxStale = 30 * time.Second
	}
	if c.Idle == 0 {
		c.Idle = 2 * time.Minute
	}
	if c.FetchLimit == 0 {
		c.FetchLimit = 50_000
	}
	if c.Wait == 0 {
		c.Wait = min(2*time.Second, c.MaxStale/2)
	}
	switch {
	case c.Refresh < 10*time.Millisecond:
		return apierr.Invalid("refresh", "%s is under 10ms", c.Refresh)
	case c.MaxStale < c.Refresh:
		return apierr.Invalid("max_stale", "%s is under the refresh %s", c.MaxStale, c.Refresh)
	case c.FetchLimit < 1 || c.FetchLimit > region.MaxLineChanges:
		return apierr.Invalid("fetch_limit", "must be 1..%d", region.MaxLineChanges)
	case c.Wait < 0 || c.Wait > region.MaxLineWait || 2*c.Wait > c.MaxStale:
		return apierr.Invalid("wait", "%s: must be 0..%s and at most half the max stale %s", c.Wait, region.MaxLineWait, c.MaxStale)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// MaxLines bounds the sales an edge watches at once (as region.MaxRooms bounds a leader's
// rooms); polls of more sales are forwarded.
const MaxLines = region.MaxRooms

// Edge is a running storefront edge. It owns a goroutine per watched sale, which fetches the
// sale's line (follow), and one that stops watching the sales no one asked about; Close
// stops them.
type Edge struct {
	cfg   Config
	ctx   context.Context // the edge's: its goroutines end with it
	mu    sync.Mutex
	lines map[string]*line
	// closed is set by Close (under mu): no line is watched after it; follows counts the
	// lines' goroutines.
	closed  bool
	follows sync.WaitGroup
	// polls counts the polls answered here, forwarded those answered by the leader; fetches
	// the LineChanges calls answered.
	polls, forwarded, fetches atomic.Uint64
	cancel                    context.CancelFunc
	done                      chan struct{}
	closeOne                  sync.Once
}

// line is the edge's copy of one sale's line.
type line struct {
	m *admission.Mirror
	// gate and region are the last feed's (region.LineFeed); terms the sale's, once the
	// waiting-room page asked them (Edge.Terms); asked is when a buyer last asked about the
	// sale (Unix nanoseconds); tag the last feed's (region.LineFeed.Tag), once applied.
	mu     sync.Mutex
	gate   string
	region string
	tag    uint64
	terms  *region.SaleTerms
	asked  atomic.Int64
	// stop ends the line's goroutine (follow).
	stop context.CancelFunc
}

// New starts an edge.
func New(cfg Config) (*Edge, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Edge{cfg: cfg, ctx: ctx, lines: map[string]*line{}, cancel: cancel, done: make(chan struct{})}
	go e.run(ctx)
	return e, nil
}

// Close stops fetching; idempotent. The upstream is the caller's to close.
func (e *Edge) Close() {
	e.closeOne.Do(func() {
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()
		e.cancel()
		<-e.done
		e.follows.Wait()
	})
}

// Polls is how many polls the edge answered itself, and how many it forwarded to the
// leader (an admission its lines did not hold yet, or a line too stale).
func (e *Edge) Polls() (answered, forwarded uint64) { return e.polls.Load(), e.forwarded.Load() }

// Fetches is how many of the leader's answers to LineChanges the edge has applied (a held
// fetch counts once, when answered).
func (e *Edge) Fetches() uint64 { return e.fetches.Load() }

// watching returns sale's line when the edge watches it, marked as asked about; nil when it
// does not (watch starts that, once the leader has answered for the sale).
func (e *Edge) watching(sale string) *line {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.lines[sale]
	if l != nil {
		l.asked.Store(e.cfg.Now().UnixNano())
	}
	return l
}

// watch returns sale's line, watched from now on (nil when MaxLines are watched). Called only
// after the leader answered for the sale, so made-up sale ids take no line.
func (e *Edge) watch(sale string) *line {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.lines[sale]
	if l == nil {
		if len(e.lines) >= MaxLines || e.closed {
			return nil
		}
		ctx, stop := context.WithCancel(e.ctx)
		l = &line{m: admission.NewMirror(), stop: stop}
		e.lines[sale] = l
		e.follows.Add(1)
		go e.follow(ctx, sale, l)
	}
	l.asked.Store(e.cfg.Now().UnixNano())
	return l
}

// fresh reports whether l was fed recently enough to answer from.
func (e *Edge) fresh(l *line, now time.Time) bool {
	at := l.m.Applied()
	return !at.IsZero() && now.Sub(at) <= e.cfg.MaxStale
}

// run stops watching the lines no one asked about for Idle, every Refresh until ctx ends.
func (e *Edge) run(ctx context.Context) {
	defer close(e.done)
	tick := time.NewTicker(e.cfg.Refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := e.cfg.Now()
		e.mu.Lock()
		for sale, l := range e.lines {
			if now.Sub(time.Unix(0, l.asked.Load())) > e.cfg.Idle {
				delete(e.lines, sale)
				l.stop()
			}
		}
		e.mu.Unlock()
	}
}

// follow keeps l up to the leader's line of sale until ctx ends (Close, or the line is no
// longer watched): it fetches at once, then again Refresh after each answer; the leader holds
// a fetch that would bring nothing new (Wait) until the line changes. A leader that has no
// line of the sale ends the watching.
func (e *Edge) follow(ctx context.Context, sale string, l *line) {
	defer e.follows.Done()
	defer l.stop()
	for {
		fctx, cancel := context.WithTimeout(ctx, e.cfg.Wait+5*time.Second)
		err := e.fetch(fctx, sale, l)
		cancel()
		switch {
		case err == nil || ctx.Err() != nil:
		case lineGone(err):
			e.forget(sale, l)
			e.cfg.Logger.Info("the leader has no waiting line of the sale (no such sale, or no waiting room); its polls go to the leader",
				"region", e.cfg.Region, "sale", sale, "err", err)
			return
		default:
			e.cfg.Logger.Debug("fetching a waiting line from the leader failed; polls are answered from the last one",
				"region", e.cfg.Region, "sale", sale, "err", err)
		}
		if sleepCtx(ctx, e.cfg.Refresh) != nil {
			return
		}
	}
}

// lineGone reports whether a leader's LineChanges answer err says it has no line of the sale:
// NOT_FOUND (it knows no such sale) or CONFLICT (the sale has no waiting room).
func lineGone(err error) bool {
	r := apierr.Reason(err)
	return r == "NOT_FOUND" || r == "CONFLICT"
}

// forget stops watching sale's line l, unless another line took its place meanwhile: its
// polls are forwarded to the leader, and a line is watched again once the leader answers
// for the sale.
func (e *Edge) forget(sale string, l *line) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lines[sale] == l {
		delete(e.lines, sale)
	}
	l.stop()
}

// maxFetchRounds bounds the fetches of one line per Refresh (each up to FetchLimit
// entries); the rest come at the next.
const maxFetchRounds = 8

// fetch brings l up to the leader's line of sale: its first call may be held by the leader
// until the line is another than the one l has (its tag), the others (after an answer cut at
// the limit) are answered at once.
func (e *Edge) fetch(ctx context.Context, sale string, l *line) error {
	for round := range maxFetchRounds {
		room, since := l.m.Since()
		l.mu.Lock()
		tag := l.tag
		l.mu.Unlock()
		wait := e.cfg.Wait
		if round > 0 {
			wait = 0
		}
		f, err := e.changes(ctx, sale, room, since, tag, wait)
		if err != nil {
			return err
		}
		e.fetches.Add(1)
		l.m.Apply(f.Feed, e.cfg.Now())
		l.mu.Lock()
		l.gate, l.region, l.tag = f.Gate, f.Region, 0
		if r, v := l.m.Since(); r == f.Room && v == f.Version {
			l.tag = f.Tag // the copy is what the tag names
		}
		l.mu.Unlock()
		if !f.More {
			return nil
		}
	}
	return nil
}
