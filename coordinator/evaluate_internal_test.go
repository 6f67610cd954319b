package coordinator

import (
	"errors"
	"strings"
	"testing"

	"github.com/quotaworks/quota/transfer"
)

// TestUnreadRegionIsTheOnlyViolation: a region whose database cannot be read makes the audit
// fail with "conservation unproven" for it, and nothing else: its units are unseen, not
// lost, so no I1 sum is reported as missing them. With every region read, a real shortfall
// still is.
func TestUnreadRegionIsTheOnlyViolation(t *testing.T) {
	snap := ledgerSnapshot{sales: []string{"s"}, skus: map[string][]SKULedger{"s": {{SKU: "phone", Total: 100}}},
		transfers: map[string]transfer.Transfer{}}
	regions := []RegionLink{{Name: "us"}, {Name: "eu"}}
	pool := func(avail transfer.Units) regionRead {
		return regionRead{books: transfer.RegionBooks{Pools: []transfer.PoolBooks{{Sale: "s", SKU: "phone", Available: avail, CreditedIn: avail}}}}
	}
	books := map[string]map[string]regionRead{
		"us": {"s": pool(60)},
		"eu": {"s": {err: errors.New("lock timeout")}},
	}
	rep, _ := evaluate(snap, books, regions, true)
	if rep.OK || len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0].Detail, "could not be read") {
		t.Fatalf("eu unread: %+v; want exactly its unproven-conservation violation", rep.Violations)
	}
	books["eu"] = map[string]regionRead{"s": pool(30)} // read, and 10 units short
	rep, _ = evaluate(snap, books, regions, true)
	if rep.OK || len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0].Detail, "total 100 != ") {
		t.Fatalf("eu read, 10 short: %+v; want the I1 sum violation", rep.Violations)
	}
}
