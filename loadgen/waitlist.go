package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/quotaworks/quota/internal/clock"
)

// errWaitedOut: a waitlisted buyer's wait (HTTPEdge.Waitlist) ended with no offer.
var errWaitedOut = errors.New("waited out on the waitlist")

// soldOutForGood is the answer a waitlisted buyer gives itself when the sale's page says the
// SKU is sold out for good (the coordinator's flag: no unit available or held anywhere).
func (b httpBuyer) soldOutForGood() error {
	return &edgeError{method: http.MethodGet, path: b.sales, status: http.StatusConflict, Code: "SOLD_OUT",
		Message: fmt.Sprintf("the sale's page says sku %s is sold out: no unit is available or held anywhere", b.cfg.SKU)}
}

// waitlist waits on the SKU's waitlist at the buyer's region for an offer, for at most
// HTTPEdge.Waitlist, and answers the offer's ticket; errWaitedOut when the wait ends first,
// SOLD_OUT when the sale's page says nothing will come back. Its polls are at most one a
// second (the answers' Retry-After): units come back at releases and expiries, not in line.
func (b httpBuyer) waitlist(ctx context.Context) (string, error) {
	b.pollFloor = time.Second
	if gone, err := b.soldOut(ctx); err != nil || gone {
		if err == nil {
			err = b.soldOutForGood()
		}
		return "", err
	}
	b.c.waitlisted.Add(1)
	wctx, cancel := context.WithTimeout(ctx, b.cfg.HTTP.Waitlist)
	defer cancel()
	last := time.Now()
	ticket, err := b.admit(wctx, b.joinWaitlist, func(ctx context.Context) error {
		if time.Since(last) < 2*time.Second { // the page is cached a second: look now and then
			return nil
		}
		last = time.Now()
		if gone, err := b.soldOut(ctx); err != nil || !gone {
			return err
		}
		return b.soldOutForGood()
	})
	switch {
	case err == nil:
		b.c.offered.Add(1)
	case wctx.Err() != nil && edgeReason(err) != "SOLD_OUT":
		return "", errWaitedOut
	}
	return ticket, err
}

// joinWaitlist joins the SKU's waitlist. Refused with CONFLICT (units came back somewhere,
// so the SKU is not drained), the buyer does as told and enters the waiting room; told
// SOLD_OUT there (a closed room), it tries the waitlist again a second later.
func (b httpBuyer) joinWaitlist(ctx context.Context, a *admissionAnswer) error {
	for {
		err := b.call(ctx, func(ctx context.Context) error {
			return b.do(ctx, http.MethodPost, b.sales+"/waitlist", map[string]string{"user_id": b.user, "sku": b.cfg.SKU}, a)
		})
		if edgeReason(err) != "CONFLICT" {
			return err
		}
		if err := b.enterRoom(ctx, a); edgeReason(err) != "SOLD_OUT" {
			return err
		}
		if clock.Sleep(ctx, time.Second) != nil {
			return fmt.Errorf("buyer %s waiting for the waitlist of %s at %s: %w", b.user, b.cfg.SKU, b.region, ctx.Err())
		}
	}
}

// soldOut reads the sale's page at the buyer's region: whether the SKU is sold out for good.
func (b httpBuyer) soldOut(ctx context.Context) (bool, error) {
	var page struct {
		SKUs []struct {
			SKU     string `json:"sku"`
			SoldOut bool   `json:"sold_out"`
		} `json:"skus"`
	}
	if err := b.call(ctx, func(ctx context.Context) error { return b.do(ctx, http.MethodGet, b.sales, nil, &page) }); err != nil {
		return false, err
	}
	for _, k := range page.SKUs {
		if k.SKU == b.cfg.SKU {
			return k.SoldOut, nil
		}
	}
	return false, fmt.Errorf("the page of sale %s at %s lists no sku %s", b.cfg.Sale, b.region, b.cfg.SKU)
}
