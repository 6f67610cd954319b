package region_test

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/quotaworks/quota/region"
)

// TestSoldOutAnswer checks the answer to a reserve of an empty pool: REGION_EXHAUSTED until
// the coordinator flags the SKU gone, then SOLD_OUT naming the sale and SKU, the same error
// value for every buyer (made once per SKU), with nothing taken; and pins its cost.
func TestSoldOutAnswer(t *testing.T) {
	var flagged atomic.Bool
	e := newEnv(t, func(c *region.Config) {
		c.SoldOut = func(sale, sku string) bool { return flagged.Load() && sale == testSale && sku == testSKU }
	})
	e.sale(defaultTerms(testSale, 1), 1)
	e.mustReserve("alice", "k1", 1)
	if _, err := e.reserve("bob", "k1", 1); !errors.Is(err, region.ErrRegionExhausted) {
		t.Fatalf("an empty pool, not flagged: %v; want REGION_EXHAUSTED", err)
	}
	flagged.Store(true)
	_, first := e.reserve("bob", "k1", 1)
	_, again := e.reserve("carol", "k9", 1)
	if !errors.Is(first, region.ErrSoldOut) || first.Error() != "sale sale1: sku1 is sold out in every region: sold out" {
		t.Fatalf("a flagged SKU: %v; want SOLD_OUT naming sale1 and sku1", first)
	}
	if again != first {
		t.Errorf("two buyers of one gone SKU got two errors: %p %p", again, first)
	}
	if res, err := e.reserve("alice", "k1", 1); err != nil || !res.Replayed {
		t.Errorf("alice's retry after the flag: %+v %v; want her hold replayed", res, err)
	}
	e.checkPool(testSale, testSKU, counts{avail: 0, held: 1})
	n := testing.AllocsPerRun(100, func() {
		if _, err := e.reserve("bob", "k1", 1); err != first {
			t.Fatalf("%v", err)
		}
	})
	if n > 0 {
		t.Errorf("a SOLD_OUT answer allocates %v times; want 0", n)
	}
}
