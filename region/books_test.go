package region_test

import (
	"reflect"
	"testing"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// ReadBooksOf reads several sales' books in one snapshot, each the same as ReadBooks of that
// sale alone; a sale the region knows nothing of has empty books; too many sales at once is
// refused.
func TestReadBooksOfEqualsReadBooks(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5, testSKU, "case"), 10)
	e.sale(defaultTerms("other", 5), 7)
	e.mustReserve("ann", "k1", 2)
	e.mustReserve("bob", "k2", 1)
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: "other", SKU: testSKU, User: "ann", Quantity: 3, RequestKey: "k3"}); err != nil {
		t.Fatal(err)
	}
	sales := []string{testSale, "other", "none"}
	all, err := region.ReadBooksOf(e.ctx, e.pool, "us", sales)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(sales) {
		t.Fatalf("books of %d sales, want %d", len(all), len(sales))
	}
	for _, s := range sales {
		one, err := region.ReadBooks(e.ctx, e.pool, "us", s)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(all[s], one) {
			t.Errorf("sale %s: read with others %+v, alone %+v", s, all[s], one)
		}
	}
	if n := len(all[testSale].Pools); n != 2 || len(all[testSale].Inbound) != 2 || all["other"].Pools[0].HeldInHolds != 3 {
		t.Errorf("books %+v: want two pools and two credits of %s, and other's 3 held", all, testSale)
	}
	if b := all["none"]; len(b.Pools) != 0 || len(b.Inbound) != 0 || len(b.Outbound) != 0 || b.Region != "us" {
		t.Errorf("a sale the region does not know has books %+v, want empty", b)
	}
	if _, err := region.ReadBooksOf(e.ctx, e.pool, "us", make([]string, transfer.MaxBooksSales+1)); err == nil {
		t.Errorf("%d sales at once accepted", transfer.MaxBooksSales+1)
	}
}
