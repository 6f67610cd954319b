package region

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// A buyer's binding to a region makes the per-user limit hold across regions: every region
// but the one recorded for (sale, buyer) refuses the buyer BOUND_ELSEWHERE, so all of the
// buyer's holds are at one region, whose limit is the buyer's. A sale with a waiting room
// binds a buyer when the room admits them (door.go), and its tickets are valid only at
// their region. A sale without one binds a buyer at their first reservation that reaches
// the writer: the reserve path's binding step (bindings.buyer) runs after the standby's
// NOT_LEADER and the empty pool's answers, before the writer decides, and writes the record
// in etcd (Config.Binding.Bind: create-if-absent, so a buyer trying every region at once is
// bound to exactly one; fencing.Binder writes the binds of many buyers arriving together in
// one transaction) before any hold of the buyer is decided, hence before it is
// acknowledged. The region then remembers the answer: the buyer's later reservations here
// do not reach etcd.

// reserveBindTimeout bounds a reservation's wait for its buyer's binding (and the caller's
// deadline, sooner). Longer than the front door's bindTimeout: a buyer in a waiting room
// goes back to the front of the line when a bind fails, while a reservation answered
// ABORTED comes back as a retry, queued behind the binds already waiting; under a slow etcd
// waiting in line is cheaper than asking again.
const reserveBindTimeout = 8 * time.Second

// Defaults of Config.Binding.MaxBindings and Config.Binding.InFlight.
const (
	DefaultMaxBindings   = 200_000
	DefaultBindsInFlight = 1024
)

// validateBinding fills in and checks the binding's bounds.
func (c *Config) validateBinding() error {
	setDefault(&c.Binding.MaxBindings, DefaultMaxBindings)
	setDefault(&c.Binding.InFlight, DefaultBindsInFlight)
	if c.Binding.MaxBindings < 2 || c.Binding.MaxBindings > 10_000_000 {
		return fmt.Errorf("max bindings %d: must be 2..10000000", c.Binding.MaxBindings)
	}
	if c.Binding.InFlight < 1 || c.Binding.InFlight > 10_000 {
		return fmt.Errorf("binds in flight %d: must be 1..10000", c.Binding.InFlight)
	}
	return nil
}

// bindings is what a region knows of its buyers' bindings: the region each (sale, buyer) it
// asked etcd about is bound to. A record is written once and never changed, so what it
// learnt stays true. It keeps at most max of them, in two generations of max/2: once the
// newer is full it becomes the older and the older is dropped, and a buyer found in the
// older moves to the newer. Safe for concurrent use; mu is a leaf lock.
type bindings struct {
	bind   func(ctx context.Context, sale, user, region string) (string, error)
	region string
	half   int
	slots  chan struct{} // a slot per etcd transaction in flight

	mu       sync.Mutex
	cur, old map[saleUser]string
	// flight is the binding under way of each buyer: the buyer's other reservations meanwhile
	// wait for its answer rather than send their own. At most one entry per caller waiting.
	flight map[saleUser]*bindCall
}

// bindCall is one buyer's binding under way; done is closed once bound and err are set.
type bindCall struct {
	done  chan struct{}
	bound string
	err   error
}

// newBindings returns cfg's bindings, or nil when cfg binds no one.
func newBindings(cfg Config) *bindings {
	if cfg.Binding.Bind == nil {
		return nil
	}
	return &bindings{bind: cfg.Binding.Bind, region: cfg.Name, half: max(1, cfg.Binding.MaxBindings/2), slots: make(chan struct{}, cfg.Binding.InFlight),
		cur: map[saleUser]string{}, old: map[saleUser]string{}, flight: map[saleUser]*bindCall{}}
}

// known returns the region k is bound to, if this region knows it. b.mu is held.
func (b *bindings) known(k saleUser) (string, bool) {
	if v, ok := b.cur[k]; ok {
		return v, true
	}
	if v, ok := b.old[k]; ok {
		b.remember(k, v)
		return v, true
	}
	return "", false
}

// remember records that k is bound to region. b.mu is held.
func (b *bindings) remember(k saleUser, region string) {
	if len(b.cur) >= b.half {
		b.old, b.cur = b.cur, make(map[saleUser]string, b.half)
	}
	b.cur[k] = region
}

// cached returns the region k is bound to when this region knows it, without etcd.
func (b *bindings) cached(k saleUser) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.known(k)
}

// of returns the region k is bound to, binding k to this region when no region is recorded:
// from memory when it is known, else by one etcd transaction per buyer at a time.
func (b *bindings) of(ctx context.Context, k saleUser) (string, error) {
	b.mu.Lock()
	if v, ok := b.known(k); ok {
		b.mu.Unlock()
		return v, nil
	}
	if c := b.flight[k]; c != nil {
		b.mu.Unlock()
		select {
		case <-c.done:
			return c.bound, c.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	c := &bindCall{done: make(chan struct{})}
	b.flight[k] = c
	b.mu.Unlock()
	defer close(c.done) // run last: the waiters then read what the function below published
	defer func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.flight, k)
		if c.err == nil {
			b.remember(k, c.bound)
		}
	}()
	c.err = fmt.Errorf("binding %s/%s: no answer", k.sale, k.user) // if bind panics, the waiters hear this
	c.bound, c.err = b.write(ctx, k)
	return c.bound, c.err
}

// write binds k to this region in etcd, in a slot: the wait for one is bounded by ctx (the
// caller's), the bind by reserveBindTimeout too. A slow etcd then makes new buyers wait in line
// here rather than pile binds onto it that time out and are asked again. The slots bound the
// binds waiting, not etcd's transactions: fencing.Binder writes those that wait together in
// one transaction.
func (b *bindings) write(ctx context.Context, k saleUser) (string, error) {
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for one of the %d binding writes in flight: %w", cap(b.slots), ctx.Err())
	}
	defer func() { <-b.slots }()
	ctx, cancel := context.WithTimeout(ctx, reserveBindTimeout)
	defer cancel()
	bound, err := b.bind(ctx, k.sale, k.user, b.region)
	if err == nil && bound == "" {
		err = fmt.Errorf("binding %s/%s: etcd answered no region", k.sale, k.user)
	}
	return bound, err
}

// buyer is the reserve path's binding step, for a sale without a waiting room: it answers
// nil once req's buyer is bound to this region (newly, or before), BOUND_ELSEWHERE naming
// the region they are bound to, or ABORTED (nothing was done: ask again) when the binding
// could not be written or read. A sale with a waiting room, or a region that binds no one
// (b nil), has no such step.
//
// A buyer the region does not know, of a sale or SKU paused here (paused), is not bound
// (unbound): the writer refuses the reservation PAUSED (or replays one granted before), and
// refuses it ABORTED should the pause have ended on the way, so that no hold is made unbound.
func (b *bindings) buyer(ctx context.Context, t SaleTerms, req ReserveRequest, paused *pauseSet) (unbound bool, err error) {
	if b == nil || t.Admission.Waiting() {
		return false, nil
	}
	k := saleUser{req.Sale, req.User}
	if _, ok := b.cached(k); !ok && paused.refuse(req) != nil {
		return true, nil
	}
	bound, err := b.of(ctx, k)
	if err != nil {
		return false, fmt.Errorf("binding buyer %s to region %s for sale %s: %v: %w", req.User, b.region, req.Sale, err, apierr.ErrAborted)
	}
	if bound != b.region {
		return false, &apierr.BoundError{Sale: req.Sale, Region: bound}
	}
	return false, nil
}

// elsewhere is buyer from memory only: BOUND_ELSEWHERE for a buyer this region knows to be
// bound to another, nil otherwise. It runs before the empty pool's answer, which binds no
// one. In a sale with a waiting room it refuses the ticket of a buyer whose binding answered
// another region after the room admitted them here (Door.bind).
func (b *bindings) elsewhere(sale, user string) error {
	if b == nil {
		return nil
	}
	if bound, ok := b.cached(saleUser{sale, user}); ok && bound != b.region {
		return &apierr.BoundError{Sale: sale, Region: bound}
	}
	return nil
}

// bindingNeeded is a confirm's answer from the writer when the hold's buyer was admitted by a
// waiting room before their binding answered and this region does not know it yet: the
// caller binds the buyer (bindings.of) and asks again, or refuses. It never reaches a caller
// of the region.
type bindingNeeded struct{ k saleUser }

func (e *bindingNeeded) Error() string {
	return fmt.Sprintf("buyer %s of sale %s: binding not known here", e.k.user, e.k.sale)
}

// confirmable is the confirm's binding guard, decided in the writer's step: nil when h may
// be sold here (or is not held and unexpired at now: nothing is sold), BOUND_ELSEWHERE when
// its buyer is known to be bound to another region, or a *bindingNeeded when the region does
// not know. Only a held hold made with a waiting room's
// ticket (Admission set) can have been made before its buyer's binding answered (Door.bind);
// a sale without one binds before the hold is decided (bindings.buyer). checked says the
// caller bound the buyer here just now (its memory of it may since have been dropped). b
// nil: the region binds no one.
func (b *bindings) confirmable(h *memHold, now time.Time, checked bool) error {
	if b == nil || checked || h.State != Held || !now.Before(h.ExpiresAt) || h.Admission == "" {
		return nil
	}
	bound, ok := b.cached(saleUser{h.Sale, h.User})
	switch {
	case !ok:
		return &bindingNeeded{saleUser{h.Sale, h.User}}
	case bound != b.region:
		return &apierr.BoundError{Sale: h.Sale, Region: bound}
	}
	return nil
}

// confirmBound runs a confirm (submit, with checked false then true) so that no hold of a
// buyer admitted before their binding answered is sold unless the buyer is bound here: when
// the writer does not know the binding (bindingNeeded), it is written or read in etcd
// (bindings.of, create-if-absent: a buyer with a hold here and bound nowhere is bound here)
// and the confirm asked again; a buyer bound elsewhere is refused BOUND_ELSEWHERE and
// release gives their holds here back. Preserves the per-user limit across regions for what
// is sold (docs/invariants.md, "The per-user limit").
func confirmBound[T any](ctx context.Context, r *Region, submit func(checked bool) (T, error)) (T, error) {
	res, err := submit(false)
	var need *bindingNeeded
	if !errors.As(err, &need) {
		return res, err
	}
	bound, err := r.binds.of(ctx, need.k)
	if err != nil {
		return res, fmt.Errorf("binding buyer %s to region %s for sale %s before the sale: %v: %w", need.k.user, r.cfg.Name, need.k.sale, err, apierr.ErrAborted)
	}
	if bound != r.cfg.Name {
		releaseBoundElsewhere(ctx, r, need.k, bound)
		return res, &apierr.BoundError{Sale: need.k.sale, Region: bound}
	}
	return submit(true)
}

// releaseBoundElsewhere gives back the holds this region's writer made for k's buyer, who is
// bound to region bound (another): they were made on a ticket handed out before the binding
// answered (Door.bind), and none of them can be sold here (confirmable). Best effort: what
// fails is logged, and a hold left behind still cannot be sold and expires at its deadline.
func releaseBoundElsewhere(ctx context.Context, r *Region, k saleUser, bound string) {
	holds, _, err := r.BuyerHolds(ctx, k.sale, k.user, MaxBuyerHolds)
	if err != nil {
		r.cfg.Logger.Warn("reading the holds of a buyer bound elsewhere failed; they expire", "sale", k.sale, "user", k.user, "bound", bound, "err", err)
		return
	}
	carts := map[string]bool{}
	for _, h := range holds {
		if h.State != Held || carts[h.CartID] {
			continue
		}
		if h.CartID != "" {
			carts[h.CartID] = true
			_, err = Carts{R: r}.Release(ctx, h.CartID)
		} else {
			_, err = r.Release(ctx, h.ID)
		}
		if err != nil {
			r.cfg.Logger.Warn("releasing a hold of a buyer bound elsewhere failed; it expires", "sale", k.sale, "user", k.user, "hold", h.ID, "bound", bound, "err", err)
			continue
		}
		r.cfg.Logger.Info("released a hold of a buyer bound elsewhere", "sale", k.sale, "user", k.user, "hold", h.ID, "bound", bound)
	}
}
