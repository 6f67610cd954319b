package coordinator

import (
	"maps"
	"slices"

	"github.com/quotaworks/quota/transfer"
)

// EvaluateSnapshot is the auditor's judgement (I1, I2, I3, I5) of one consistent snapshot
// taken without a database: the ledger's SKUs by sale, its transfers by id, and every
// region's books by region and sale. The deterministic simulation uses it, so it checks its
// runs with the same rules the live audit applies. final says nothing is moving (every
// transfer is settled or final). A snapshot the rules find out of step (a record the ledger
// does not know) is reported as a violation: a snapshot taken at one instant cannot be.
func EvaluateSnapshot(skus map[string][]SKULedger, transfers map[string]transfer.Transfer,
	books map[string]map[string]transfer.RegionBooks, final bool) Report {
	snap := ledgerSnapshot{sales: slices.Sorted(maps.Keys(skus)), skus: skus, transfers: transfers}
	reads := map[string]map[string]regionRead{}
	var regions []RegionLink
	for _, name := range slices.Sorted(maps.Keys(books)) {
		regions = append(regions, RegionLink{Name: name})
		reads[name] = map[string]regionRead{}
		for sale, b := range books[name] {
			reads[name][sale] = regionRead{books: b}
		}
	}
	rep, stale := evaluate(snap, reads, regions, final)
	if stale {
		rep.OK = false
		rep.Violations = append(rep.Violations, Violation{"I5", "", "", "",
			"a region's transfer records and the ledger disagree in a single snapshot"})
	}
	return rep
}
