package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

type buyer struct {
	cfg    *Config
	c      *counters
	region string
	rc     *regionClient
	rng    *rand.Rand
	id     int64
}

// maxAttempts bounds a buyer's retries of one call: about 8 s of pauses, longer than a
// region's failover (its lease TTL plus the takeover).
const maxAttempts = 20

// call retries fn on outcomes a client cannot tell from success or failure, with the same
// request (hence the same idempotency key), up to 8 times with growing pauses.
func (b buyer) call(ctx context.Context, fn func(context.Context) error) error {
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			b.c.retries.Add(1)
			if apierr.Reason(err) == "OVERLOADED" {
				b.c.throttled.Add(1)
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(max(apierr.RetryAfter(err), min(time.Duration(attempt*attempt)*20*time.Millisecond, 500*time.Millisecond))):
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = fn(cctx)
		cancel()
		if err == nil || !retryable(err) {
			return err
		}
		if hint := apierr.LeaderHint(err); hint != "" {
			_ = b.rc.follow(hint)
		} else if b.cfg.Resolve != nil {
			b.rc.resolve(ctx, b.region, b.cfg.Resolve) // a dead leader names nobody: ask where the region is now
		}
	}
	return err
}

func (b buyer) run(ctx context.Context) {
	b.c.buyers.Add(1)
	user := fmt.Sprintf("%sbuyer-%d", b.cfg.UserPrefix, b.id)
	var res *quotav1.ReserveResponse
	tries := 0
	err := b.call(ctx, func(ctx context.Context) (err error) {
		tries++
		res, err = b.rc.get().Reserve(ctx, &quotav1.ReserveRequest{SaleId: b.cfg.Sale, Sku: b.cfg.SKU, UserId: user,
			Quantity: int64(b.cfg.Quantity), RequestKey: "checkout-1"})
		return err
	})
	if err != nil {
		b.c.refuse(b.region, apierr.Reason(err), err)
		return
	}
	h := res.GetReservation()
	if res.GetReplayed() && tries == 1 {
		// Replayed at the first try: an earlier run with the same buyers got this hold (and
		// decided its fate). A replay after a retry is this run's own hold, counted below.
		b.c.earlier.Add(1)
		return
	}
	b.c.grant(b.region, h.GetHoldId(), h.GetQuantity())
	settle(ctx, b.cfg, b.c, b.rng, h.GetHoldId(), "pay-"+user, b)
}

// holdCalls are the calls a buyer makes on its hold, over gRPC or the HTTP edge.
type holdCalls interface {
	// confirm pays for the hold: sold, or (false) refunded.
	confirm(ctx context.Context, hold, payment string) (sold bool, err error)
	release(ctx context.Context, hold string) error
}

// grant counts a hold granted at region.
func (c *counters) grant(region, hold string, units int64) {
	c.granted.Add(1)
	c.units.Add(units)
	c.mu.Lock()
	c.perRegion[region] += units
	c.holds[hold] = region
	c.mu.Unlock()
}

// settle decides, by the buyer's own random source, what becomes of its hold: paid
// (ConfirmRatio), released (ReleaseRatio) or abandoned to expire.
func settle(ctx context.Context, cfg *Config, c *counters, rng *rand.Rand, hold, payment string, calls holdCalls) {
	switch x := rng.Float64(); {
	case x < cfg.ConfirmRatio:
		sold, err := calls.confirm(ctx, hold, payment)
		switch {
		case err != nil:
			c.fail(err)
		case sold:
			c.confirmed.Add(1)
		default:
			c.refunded.Add(1)
		}
	case x < cfg.ConfirmRatio+cfg.ReleaseRatio:
		if err := calls.release(ctx, hold); err != nil {
			c.fail(err)
			return
		}
		c.released.Add(1)
	default:
		c.abandoned.Add(1)
	}
}

func (b buyer) confirm(ctx context.Context, hold, payment string) (bool, error) {
	var res *quotav1.ConfirmResponse
	err := b.call(ctx, func(ctx context.Context) (err error) {
		res, err = b.rc.get().Confirm(ctx, &quotav1.ConfirmRequest{HoldId: hold, PaymentId: payment})
		return err
	})
	return res.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD, err
}

func (b buyer) release(ctx context.Context, hold string) error {
	return b.call(ctx, func(ctx context.Context) error {
		_, err := b.rc.get().Release(ctx, &quotav1.ReleaseRequest{HoldId: hold})
		return err
	})
}

// refuse counts a buyer turned away at region with reason (the answer's REASON), or a
// failure; false for a failure.
func (c *counters) refuse(region, reason string, err error) bool {
	switch reason {
	case "REGION_EXHAUSTED":
		c.exhausted.Add(1)
		if c.onExhausted != nil {
			c.onExhausted(region, time.Now())
		}
	case "SOLD_OUT":
		c.soldOut.Add(1)
	case "LIMIT_EXCEEDED":
		c.limited.Add(1)
	case "PAUSED":
		c.paused.Add(1)
	case "BOUND_ELSEWHERE":
		c.bound.Add(1)
	case "OVERLOADED":
		c.overloaded.Add(1)
	default:
		c.fail(err)
		return false
	}
	return true
}
