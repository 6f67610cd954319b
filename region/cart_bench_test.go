package region_test

import (
	"fmt"
	"testing"

	"github.com/quotaworks/quota/region"
)

// BenchmarkCartDecision compares, in the writer's memory (region.Core: the same ops, no
// SQL), a cart of a phone and a case with the two single reserves of the same lines: the
// cost of deciding a cart against its lines'.
func BenchmarkCartDecision(b *testing.B) {
	newCore := func() *region.Core {
		c := region.NewCore("us")
		if err := c.PutSale(1, region.SaleTerms{Sale: "s", SKUs: []string{"phone", "case"}, PerUserLimit: 1, HoldTTL: testTTL, OpensAt: t0}); err != nil {
			b.Fatal(err)
		}
		for _, sku := range []string{"phone", "case"} {
			if _, err := c.Credit(region.CreditRequest{Generation: 1, TransferID: "t-" + sku, Sale: "s", SKU: sku, Units: 1 << 30}); err != nil {
				b.Fatal(err)
			}
		}
		return c
	}
	lines := []region.CartLine{{SKU: "phone", Quantity: 1}, {SKU: "case", Quantity: 1}}
	b.Run("cart", func(b *testing.B) {
		c := newCore()
		for i := range b.N {
			u := fmt.Sprintf("u%d", i)
			if _, err := c.ReserveCart(t0, region.CartRequest{Sale: "s", User: u, RequestKey: "k", Lines: lines},
				[]string{u + "-0", u + "-1"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("two reserves", func(b *testing.B) {
		c := newCore()
		for i := range b.N {
			u := fmt.Sprintf("u%d", i)
			for j, l := range lines {
				if _, err := c.Reserve(t0, region.ReserveRequest{Sale: "s", SKU: l.SKU, User: u, Quantity: 1, RequestKey: l.SKU},
					fmt.Sprintf("%s-%d", u, j)); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
