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
	// Worked out by hand: 10 credited to each pool of testSale, 3 of its phone held (ann 2,
	// bob 1); 7 credited to other's, 3 held by ann.
	want := map[[2]string][4]transfer.Units{ // available, held, credited_in, held in holds
		{testSale, testSKU}: {7, 3, 10, 3}, {testSale, "case"}: {10, 0, 10, 0}, {"other", testSKU}: {4, 3, 7, 3}}
	got := 0
	for _, s := range sales {
		for _, p := range all[s].Pools {
			got++
			if w := want[[2]string{s, p.SKU}]; p.Sale != s || [4]transfer.Units{p.Available, p.Held, p.CreditedIn, p.HeldInHolds} != w {
				t.Errorf("pool %s/%s: %+v, want available, held, credited in, held in holds %v", s, p.SKU, p, w)
			}
		}
	}
	if got != len(want) || len(all[testSale].Inbound) != 2 || len(all["other"].Inbound) != 1 {
		t.Errorf("books %+v: want %d pools, two credits of %s and one of other", all, len(want), testSale)
	}
	if b := all["none"]; len(b.Pools) != 0 || len(b.Inbound) != 0 || len(b.Outbound) != 0 || b.Region != "us" {
		t.Errorf("a sale the region does not know has books %+v, want empty", b)
	}
	if _, err := region.ReadBooksOf(e.ctx, e.pool, "us", make([]string, transfer.MaxBooksSales+1)); err == nil {
		t.Errorf("%d sales at once accepted", transfer.MaxBooksSales+1)
	}
}
