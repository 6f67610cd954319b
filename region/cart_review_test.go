package region_test

import (
	"errors"
	"testing"

	"github.com/quotaworks/quota/region"
)

// TestCartKeyIsNotASingleReservesToo: a request key used for a single reserve and then
// for a cart (or the other way round) must not take units twice: the second request is a
// different request under the same (sale, user, request_key) and should be ALREADY_EXISTS.
func TestCartKeyIsNotASingleReservesToo(t *testing.T) {
	e := cartEnv(t)
	single, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: phone, User: "bob", Quantity: 1, RequestKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.cart("bob", "k", line(phone, 1), line(cases, 1))
	if !errors.Is(err, region.ErrAlreadyExists) {
		t.Errorf("cart with key k after a single reserve with key k (hold %s): %+v %v; want ALREADY_EXISTS", single.Hold.ID, res, err)
	}
	cart := e.mustCart("carol", "k2", line(phone, 1))
	again, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: phone, User: "carol", Quantity: 1, RequestKey: "k2"})
	if !errors.Is(err, region.ErrAlreadyExists) {
		t.Errorf("single reserve with key k2 after cart %s with key k2: %+v %v; want ALREADY_EXISTS", cart.CartID, again, err)
	}
	if n := e.buyerHolds("bob") + e.buyerHolds("carol"); n != 2 {
		t.Errorf("%d holds for two request keys; want 2", n)
	}
}

// TestPausedCartOfAnUnboundBuyerIsPaused: in a sale with bindings, a cart whose line 0's SKU
// (or the whole sale) is paused must be refused PAUSED, as a single reserve is, not ABORTED
// ("resumed while on its way").
func TestPausedCartOfAnUnboundBuyerIsPaused(t *testing.T) {
	b := newEtcdBinds(t)
	e := newEnv(t, b.config)
	e.sale(defaultTerms(testSale, 2, phone, cases), 5)
	e.pause(1, phone, true, 1, "recall")
	if _, err := e.cart("hank", "k", line(phone, 1), line(cases, 1)); !errors.Is(err, region.ErrPaused) {
		t.Errorf("cart with a paused line 0 (phone): %v; want PAUSED", err)
	}
	e.pause(1, "", true, 2, "stop")
	if _, err := e.cart("ivan", "k", line(cases, 1)); !errors.Is(err, region.ErrPaused) {
		t.Errorf("cart in a paused sale: %v; want PAUSED", err)
	}
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: cases, User: "ivan", Quantity: 1, RequestKey: "k1"}); !errors.Is(err, region.ErrPaused) {
		t.Errorf("single reserve in a paused sale: %v; want PAUSED (the reference)", err)
	}
}
