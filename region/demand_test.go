package region_test

import (
	"errors"
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// RecentDemand is the units granted (holds created) and, within about a second, the units
// refused for want of stock; a replay, a refusal for another reason and a request for an
// unknown sale count nothing.
func TestRecentDemandCountsGrantedAndRefused(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5), 6)
	e.mustReserve("alice", "k", 2)
	e.mustReserve("alice", "k", 2) // a replay: no new demand
	if _, err := e.reserve("alice", "k2", 4); !errors.Is(err, region.ErrLimitExceeded) {
		t.Fatalf("alice's 4 more (of the 4 left) over her limit of 5: %v; want LIMIT_EXCEEDED", err)
	}
	if _, err := e.reserve("bob", "k", 5); !errors.Is(err, region.ErrRegionExhausted) {
		t.Fatalf("bob's 5 of the 4 left: %v; want REGION_EXHAUSTED", err)
	}
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: "nosuch", SKU: testSKU, User: "x", Quantity: 1, RequestKey: "k"}); err == nil {
		t.Fatal("a sale the region does not know was granted")
	}
	e.mustReserve("carol", "k", 1)
	want := transfer.Units(2 + 5 + 1)
	var got map[string]transfer.Units
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		if got, err = region.RecentDemand(e.ctx, e.pool, testSale, t0.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		if got[testSKU] == want {
			break
		}
	}
	if got[testSKU] != want || len(got) != 1 {
		t.Fatalf("recent demand %v; want %s: %d (2 granted, 5 refused for stock, 1 granted)", got, testSKU, want)
	}
	if later, err := region.RecentDemand(e.ctx, e.pool, testSale, t0.Add(time.Minute)); err != nil || len(later) != 0 {
		t.Fatalf("demand since a minute later: %v, %v; want none", later, err)
	}
}
