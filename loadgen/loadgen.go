// Package loadgen drives simulated buyers against regions, as storefronts would: over gRPC,
// or through the regions' storefront HTTP/JSON edges and their waiting rooms (Config.HTTP).
// Each buyer calls its nearest region (chosen by a skewed weight), retries with the same
// request key when the outcome is unknown, then pays, cancels or walks away. The demo, the
// acceptance tests and benchmarks share it. Every run is bounded in buyers and time.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// Region is a region a buyer can call, and its share of buyers.
type Region struct {
	Name   string
	Addr   string
	Weight int64
}

// Config is one load run.
type Config struct {
	Sale    string
	SKU     string
	Regions []Region
	// Creds are the buyers' transport credentials: TLS with a storefront certificate, or
	// insecure.NewCredentials() for a plaintext cluster. Required unless HTTP is set.
	Creds credentials.TransportCredentials
	// HTTP, when set, sends the buyers through the regions' storefront HTTP/JSON edges (the
	// waiting room, then a reservation with its ticket) instead of gRPC; nil: gRPC.
	HTTP *HTTPEdge
	// Buyers is how many distinct buyers arrive, each with one Reserve (retried as needed).
	Buyers int
	// Concurrency is how many buyers are in flight at once.
	Concurrency int
	// Quantity is the units each buyer asks for.
	Quantity transfer.Units
	// Cart, when set, is cart mode: each buyer reserves these lines in one call, in place of
	// SKU and Quantity (every line held, one hold per line sharing a cart id, or none), and
	// confirms or releases the cart whole by its cart id. gRPC only; at most MaxCartLines.
	Cart []CartLine
	// ConfirmRatio of granted holds are paid for, ReleaseRatio released; the rest abandoned
	// (they expire).
	ConfirmRatio, ReleaseRatio float64
	// UserPrefix makes buyer ids distinct across runs.
	UserPrefix string
	// MaxDuration bounds the run.
	MaxDuration time.Duration
	Seed        uint64
	// Resolve, when set, names where a region answers now (its current leader's address):
	// buyers ask it when their region stops answering without naming a new leader, as after
	// the leader was killed.
	Resolve func(ctx context.Context, region string) string
	// Rate, when positive, paces the buyers' arrivals: buyer n starts no sooner than n/Rate
	// seconds into the run (a flash sale's crowd arrives over time, not all at once); 0: as
	// fast as Concurrency allows.
	Rate float64
	// OnExhausted, when set, is called as each buyer is told REGION_EXHAUSTED, with its
	// region and the time (from the buyers' goroutines: it must be safe for concurrent use).
	OnExhausted func(region string, at time.Time)
	// Progress, when set, is called about every ProgressEvery with the running totals.
	Progress      func(Stats)
	ProgressEvery time.Duration
}

// Stats are a run's totals.
type Stats struct {
	Buyers, Granted, UnitsGranted, Exhausted, SoldOut, Limited, Failed, Retries int64
	// Earlier counts buyers whose first reserve replayed a hold an earlier run with the same
	// buyer ids got: not granted by this run, and not paid or released again.
	Earlier int64
	// Paused counts buyers refused because the sale or SKU is paused (the kill switch).
	Paused int64
	// Bound counts buyers refused because they are bound to another region for the sale
	// (BOUND_ELSEWHERE: a waiting room admitted them there first).
	Bound int64
	// Overloaded counts buyers who gave up still told OVERLOADED after their bounded retries;
	// Throttled counts the OVERLOADED (HTTP 429) answers waited out and retried.
	Overloaded, Throttled int64
	// Admitted counts buyers given a ticket (by a waiting room or a waitlist's offer), and
	// Polls the polls of queued admissions (HTTP mode).
	Admitted, Polls int64
	// Waitlisted counts the buyers told SOLD_OUT who joined a waitlist (HTTPEdge.Waitlist),
	// Offered those of them given a ticket (an offer, or the waiting room's once units came
	// back), and WaitedOut those whose wait ended first.
	Waitlisted, Offered, WaitedOut int64
	// Confirmed, Refunded, Released and Abandoned count what became of the holds (in cart
	// mode, of the carts: each settled whole).
	Confirmed, Refunded, Released, Abandoned int64
	// Carts counts the carts granted in cart mode (Config.Cart), each of whose lines is a hold
	// counted in Granted, UnitsGranted and Holds. CartsRefused counts the carts refused whole,
	// nothing held: each is also a buyer counted by its reason above (Exhausted, SoldOut,
	// Limited, Paused, Bound, Overloaded).
	Carts, CartsRefused int64
	// CartRefusals are the refused carts by the SKU of the line that refused them (the first
	// refused line; "?" when the answer named none), then by reason; nil when none was.
	CartRefusals map[string]map[string]int64
	PerRegion    map[string]int64 // units granted per region
	Elapsed      time.Duration
	// Holds are the granted holds (id → region), for checks after the run.
	Holds map[string]string
	// FirstError is the first failed call's error, so a run that fails says why; "" if none.
	FirstError string
}

type counters struct {
	buyers, granted, units, exhausted, soldOut, limited, failed, retries atomic.Int64
	earlier                                                              atomic.Int64
	paused, bound, overloaded, throttled, admitted, polls                atomic.Int64
	waitlisted, offered, waitedOut                                       atomic.Int64
	confirmed, refunded, released, abandoned                             atomic.Int64
	carts, cartsRefused                                                  atomic.Int64
	mu                                                                   sync.Mutex
	perRegion                                                            map[string]int64
	holds                                                                map[string]string
	cartRefusals                                                         map[string]map[string]int64 // sku → reason → carts
	firstErr                                                             string
	onExhausted                                                          func(region string, at time.Time)
}

// fail counts a failed call and keeps the first one's error.
func (c *counters) fail(err error) {
	c.failed.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.firstErr == "" && err != nil {
		c.firstErr = err.Error()
	}
}

func (c *counters) snapshot(start time.Time) Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	pr := map[string]int64{}
	for k, v := range c.perRegion {
		pr[k] = v
	}
	holds := make(map[string]string, len(c.holds))
	for k, v := range c.holds {
		holds[k] = v
	}
	return Stats{Buyers: c.buyers.Load(), Granted: c.granted.Load(), UnitsGranted: c.units.Load(), Exhausted: c.exhausted.Load(),
		SoldOut: c.soldOut.Load(), Limited: c.limited.Load(), Failed: c.failed.Load(), Retries: c.retries.Load(), Earlier: c.earlier.Load(),
		Paused: c.paused.Load(), Bound: c.bound.Load(), Overloaded: c.overloaded.Load(), Throttled: c.throttled.Load(),
		Admitted: c.admitted.Load(), Polls: c.polls.Load(), Waitlisted: c.waitlisted.Load(), Offered: c.offered.Load(),
		WaitedOut: c.waitedOut.Load(), Confirmed: c.confirmed.Load(), Refunded: c.refunded.Load(), Released: c.released.Load(), Abandoned: c.abandoned.Load(),
		PerRegion: pr, Elapsed: time.Since(start), Holds: holds, FirstError: c.firstErr,
		Carts: c.carts.Load(), CartsRefused: c.cartsRefused.Load(), CartRefusals: copyRefusals(c.cartRefusals)}
}

// InvalidError is a Config setting Run does not accept. Field names the setting in the form
// of its command-line flag ("buyers", "duration"; "confirm" for the two ratios together),
// so a CLI can point at the flag.
type InvalidError struct {
	Field string
	Value string
	Want  string
}

// Error says which setting, its value and what it must be.
func (e *InvalidError) Error() string { return fmt.Sprintf("%s %s: %s", e.Field, e.Value, e.Want) }

// Validate checks the run's configuration and fills in its defaults.
func (c *Config) Validate() error {
	if len(c.Regions) == 0 {
		return errors.New("loadgen: no regions")
	}
	if c.HTTP != nil {
		if err := c.HTTP.validate(c.Regions); err != nil {
			return err
		}
	} else if c.Creds == nil {
		return errors.New("loadgen: no transport credentials (a storefront certificate, or insecure)")
	}
	return c.CheckSettings()
}

// CheckSettings checks the settings other than the regions (an *InvalidError), so that a CLI
// can refuse them before it looks the regions up, and fills in their defaults.
func (c *Config) CheckSettings() error {
	switch {
	case c.Buyers <= 0 || c.Buyers > 10_000_000:
		return &InvalidError{"buyers", fmt.Sprint(c.Buyers), "must be 1..10000000"}
	case c.Concurrency <= 0 || c.Concurrency > 10_000:
		return &InvalidError{"concurrency", fmt.Sprint(c.Concurrency), "must be 1..10000"}
	case c.ConfirmRatio < 0 || c.ReleaseRatio < 0 || c.ConfirmRatio+c.ReleaseRatio > 1:
		return &InvalidError{"confirm", fmt.Sprintf("%g (release %g)", c.ConfirmRatio, c.ReleaseRatio),
			"the confirm and release ratios must each be 0..1, and together at most 1"}
	case c.Rate < 0 || c.Rate > 1e7:
		return &InvalidError{"rate", fmt.Sprint(c.Rate), "must be 0..10000000 buyers per second (0: unpaced)"}
	case c.MaxDuration < 0:
		return &InvalidError{"duration", c.MaxDuration.String(), "must not be negative (0 means 10m)"}
	}
	if err := c.checkCart(); err != nil {
		return err
	}
	if c.Quantity == 0 {
		c.Quantity = 1
	}
	if c.MaxDuration == 0 {
		c.MaxDuration = 10 * time.Minute
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
	return nil
}

// Run drives the buyers and returns the totals. It stops early when ctx ends or MaxDuration
// passes; buyers not started by then are not counted. In HTTP mode it first pings every
// region's edge, and fails (ErrEdgeUnreachable) if one does not answer.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	if err := cfg.Validate(); err != nil {
		return Stats{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	defer cancel()
	var total int64
	for _, r := range cfg.Regions {
		total += r.Weight
	}
	if total <= 0 {
		return Stats{}, errors.New("loadgen: region weights sum to zero")
	}
	start, err := startBuyers(ctx, &cfg)
	if err != nil {
		return Stats{}, err
	}
	c := &counters{perRegion: map[string]int64{}, holds: map[string]string{}, cartRefusals: map[string]map[string]int64{},
		onExhausted: cfg.OnExhausted}
	began := time.Now()
	stopProgress := startProgress(ctx, cfg, c, began)
	defer stopProgress()
	defer start.close()
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				n := next.Add(1) - 1
				if n >= int64(cfg.Buyers) || !arrive(ctx, cfg.Rate, began, n) {
					return
				}
				rng := buyerRNG(cfg.Seed, n)
				start.run(ctx, c, pick(rng, cfg.Regions, total), rng, n)
			}
		}()
	}
	wg.Wait()
	return c.snapshot(began), nil
}

// arrive waits until buyer n's arrival at rate buyers per second from began (at once when
// rate is 0); false when ctx ends first.
func arrive(ctx context.Context, rate float64, began time.Time, n int64) bool {
	if rate <= 0 {
		return true
	}
	wait := time.Until(began.Add(time.Duration(float64(n) / rate * float64(time.Second))))
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// starter runs buyers in one mode: over gRPC (a client per region) or through the edges.
type starter struct {
	cfg     *Config
	clients []*regionClient // gRPC mode
}

// startBuyers prepares the mode's connections: gRPC clients, or a ping of every edge.
func startBuyers(ctx context.Context, cfg *Config) (*starter, error) {
	s := &starter{cfg: cfg}
	if cfg.HTTP != nil {
		return s, cfg.HTTP.ping(ctx, cfg.Regions)
	}
	for _, r := range cfg.Regions {
		rc, err := newRegionClient(r.Addr, cfg.Creds)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("region %s: %w", r.Name, err)
		}
		s.clients = append(s.clients, rc)
	}
	return s, nil
}

// run runs buyer n at region i.
func (s *starter) run(ctx context.Context, c *counters, i int, rng *rand.Rand, n int64) {
	name := s.cfg.Regions[i].Name
	if s.cfg.HTTP != nil {
		newHTTPBuyer(s.cfg, c, name, rng, n).run(ctx)
		return
	}
	b := buyer{cfg: s.cfg, c: c, region: name, rc: s.clients[i], rng: rng, id: n}
	if len(s.cfg.Cart) > 0 {
		cartBuyer{b}.run(ctx)
		return
	}
	b.run(ctx)
}

func (s *starter) close() {
	for _, rc := range s.clients {
		rc.close()
	}
}

// buyerRNG is buyer n's own random source: its region and what it does with its hold depend
// on the seed and n alone, not on which worker happened to take it, so a run repeated with
// the same seed sends every buyer to the same region with the same request (and a replay is
// recognised as one) instead of making new holds elsewhere.
func buyerRNG(seed uint64, n int64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(n)))
}

func pick(rng *rand.Rand, regions []Region, total int64) int {
	x := rng.Int64N(total)
	for i, r := range regions {
		if x < r.Weight {
			return i
		}
		x -= r.Weight
	}
	return len(regions) - 1
}

func startProgress(ctx context.Context, cfg Config, c *counters, start time.Time) func() {
	if cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				cfg.Progress(c.snapshot(start))
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// regionClient is a storefront's connection to one region. A NOT_LEADER answer that names
// the leader moves it there (after a failover the standby answers on its own address).
type regionClient struct {
	mu       sync.Mutex
	cur      quotav1.RegionServiceClient
	conns    map[string]*grpc.ClientConn
	creds    credentials.TransportCredentials
	resolved time.Time
}

// resolve asks where the region answers now and follows it; at most every 200 ms however
// many buyers ask, so a failover does not turn into a storm of lookups.
func (rc *regionClient) resolve(ctx context.Context, region string, fn func(context.Context, string) string) {
	rc.mu.Lock()
	if time.Since(rc.resolved) < 200*time.Millisecond {
		rc.mu.Unlock()
		return
	}
	rc.resolved = time.Now()
	rc.mu.Unlock()
	if addr := fn(ctx, region); addr != "" {
		_ = rc.follow(addr)
	}
}

func newRegionClient(addr string, creds credentials.TransportCredentials) (*regionClient, error) {
	rc := &regionClient{conns: map[string]*grpc.ClientConn{}, creds: creds}
	return rc, rc.follow(addr)
}

func (rc *regionClient) get() quotav1.RegionServiceClient {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.cur
}

func (rc *regionClient) follow(addr string) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	conn, ok := rc.conns[addr]
	if !ok {
		var err error
		if conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(rc.creds)); err != nil {
			return err
		}
		rc.conns[addr] = conn
	}
	rc.cur = quotav1.NewRegionServiceClient(conn)
	return nil
}

func (rc *regionClient) close() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, c := range rc.conns {
		c.Close()
	}
}

// retryable is an outcome a real client retries with the same key: the request may or may
// not have taken effect (unknown outcome, timeouts, a region between leaders), or was turned
// away by a full queue.
func retryable(err error) bool {
	switch apierr.Reason(err) {
	case "UNKNOWN_OUTCOME", "NOT_LEADER", "OVERLOADED": // OVERLOADED: nothing was done; its retry-after is waited
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}
