package loadgen

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
)

// CartLine is one line of the cart each buyer reserves in cart mode (Config.Cart): Quantity
// units of SKU.
type CartLine struct {
	SKU      string
	Quantity transfer.Units
}

// MaxCartLines is the most lines a cart may have: the regions' limit.
const MaxCartLines = 16

// checkCart checks Config.Cart (an *InvalidError naming "cart"): 1..MaxCartLines lines, each
// a named SKU once with 1..transfer.MaxUnits units, in place of SKU, over gRPC only.
func (c *Config) checkCart() error {
	if len(c.Cart) == 0 {
		return nil
	}
	invalid := func(want string) error { return &InvalidError{"cart", cartString(c.Cart), want} }
	switch {
	case c.SKU != "":
		return invalid(fmt.Sprintf("a cart's lines come in place of sku (%q): give one or the other", c.SKU))
	case len(c.Cart) > MaxCartLines:
		return invalid(fmt.Sprintf("%d lines, more than the %d a cart may have", len(c.Cart), MaxCartLines))
	case c.HTTP != nil:
		return invalid("carts are reserved over gRPC: not with the HTTP edges")
	}
	seen := map[string]bool{}
	for i, l := range c.Cart {
		switch {
		case l.SKU == "":
			return invalid(fmt.Sprintf("line %d has no sku", i))
		case seen[l.SKU]:
			return invalid(fmt.Sprintf("sku %s given twice: one line per sku", l.SKU))
		case l.Quantity <= 0 || l.Quantity > transfer.MaxUnits:
			return invalid(fmt.Sprintf("sku %s: quantity %d, want 1..%d", l.SKU, l.Quantity, transfer.MaxUnits))
		}
		seen[l.SKU] = true
	}
	return nil
}

// cartString renders lines as the command line takes them: phone=1,case=1.
func cartString(lines []CartLine) string {
	parts := make([]string, len(lines))
	for i, l := range lines {
		parts[i] = fmt.Sprintf("%s=%d", l.SKU, l.Quantity)
	}
	return strings.Join(parts, ",")
}

// cartBuyer is a buyer in cart mode: it reserves Config.Cart in one call and settles the
// cart whole, by its cart id.
type cartBuyer struct{ buyer }

func (b cartBuyer) run(ctx context.Context) {
	b.c.buyers.Add(1)
	user := fmt.Sprintf("%sbuyer-%d", b.cfg.UserPrefix, b.id)
	lines := make([]*quotav1.CartLine, len(b.cfg.Cart))
	for i, l := range b.cfg.Cart {
		lines[i] = &quotav1.CartLine{Sku: l.SKU, Quantity: int64(l.Quantity)}
	}
	var res *quotav1.ReserveResponse
	tries := 0
	err := b.call(ctx, func(ctx context.Context) (err error) {
		tries++
		res, err = b.rc.get().Reserve(ctx, &quotav1.ReserveRequest{SaleId: b.cfg.Sale, UserId: user, Lines: lines,
			RequestKey: "checkout-1"})
		return err
	})
	switch {
	case err != nil:
		b.c.refuseCart(b.region, err)
		return
	case res.GetReplayed() && tries == 1: // an earlier run's cart, as for a single hold
		b.c.earlier.Add(1)
		return
	}
	b.c.carts.Add(1)
	for _, h := range res.GetReservations() {
		b.c.grant(b.region, h.GetHoldId(), h.GetQuantity())
	}
	settle(ctx, b.cfg, b.c, b.rng, res.GetCartId(), "pay-"+user, b)
}

// refuseCart counts a cart refused whole at region: by its reason, as a buyer refused, and
// by the SKU of the line that refused it; a failure (no reason a region refuses with) is
// counted as one.
func (c *counters) refuseCart(region string, err error) {
	reason := apierr.Reason(err)
	if !c.refuse(region, reason, err) {
		return
	}
	c.cartsRefused.Add(1)
	sku := apierr.LineSKU(err)
	if sku == "" {
		sku = "?" // a refusal of the whole cart (a paused sale), no line named
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cartRefusals[sku] == nil {
		c.cartRefusals[sku] = map[string]int64{}
	}
	c.cartRefusals[sku][reason]++
}

// copyRefusals is a deep copy of the refused carts' counts, nil when there are none.
func copyRefusals(m map[string]map[string]int64) map[string]map[string]int64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]map[string]int64, len(m))
	for sku, byReason := range m {
		out[sku] = maps.Clone(byReason)
	}
	return out
}

// confirm pays for the whole cart: every line sold, or (false) none, to refund.
func (b cartBuyer) confirm(ctx context.Context, cart, payment string) (bool, error) {
	var res *quotav1.ConfirmResponse
	err := b.call(ctx, func(ctx context.Context) (err error) {
		res, err = b.rc.get().Confirm(ctx, &quotav1.ConfirmRequest{CartId: cart, PaymentId: payment})
		return err
	})
	return res.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD, err
}

// release gives every held line of the cart back.
func (b cartBuyer) release(ctx context.Context, cart string) error {
	return b.call(ctx, func(ctx context.Context) error {
		_, err := b.rc.get().Release(ctx, &quotav1.ReleaseRequest{CartId: cart})
		return err
	})
}
