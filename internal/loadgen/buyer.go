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
		b.countRefusal(err)
		return
	}
	h := res.GetReservation()
	if res.GetReplayed() && tries == 1 {
		// Replayed at the first try: an earlier run with the same buyers got this hold (and
		// decided its fate). A replay after a retry is this run's own hold, counted below.
		b.c.earlier.Add(1)
		return
	}
	b.c.granted.Add(1)
	b.c.units.Add(h.GetQuantity())
	b.c.mu.Lock()
	b.c.perRegion[b.region] += h.GetQuantity()
	b.c.holds[h.GetHoldId()] = b.region
	b.c.mu.Unlock()
	switch x := b.rng.Float64(); {
	case x < b.cfg.ConfirmRatio:
		b.pay(ctx, h.GetHoldId(), "pay-"+user)
	case x < b.cfg.ConfirmRatio+b.cfg.ReleaseRatio:
		if err := b.call(ctx, func(ctx context.Context) error {
			_, err := b.rc.get().Release(ctx, &quotav1.ReleaseRequest{HoldId: h.GetHoldId()})
			return err
		}); err != nil {
			b.c.fail(err)
			return
		}
		b.c.released.Add(1)
	default:
		b.c.abandoned.Add(1)
	}
}

func (b buyer) pay(ctx context.Context, hold, payment string) {
	var res *quotav1.ConfirmResponse
	err := b.call(ctx, func(ctx context.Context) (err error) {
		res, err = b.rc.get().Confirm(ctx, &quotav1.ConfirmRequest{HoldId: hold, PaymentId: payment})
		return err
	})
	switch {
	case err != nil:
		b.c.fail(err)
	case res.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD:
		b.c.confirmed.Add(1)
	default:
		b.c.refunded.Add(1)
	}
}

func (b buyer) countRefusal(err error) {
	switch apierr.Reason(err) {
	case "REGION_EXHAUSTED":
		b.c.exhausted.Add(1)
	case "SOLD_OUT":
		b.c.soldOut.Add(1)
	case "LIMIT_EXCEEDED":
		b.c.limited.Add(1)
	case "PAUSED":
		b.c.paused.Add(1)
	default:
		b.c.fail(err)
	}
}
