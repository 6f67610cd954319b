package coordinator

import (
	"fmt"

	"github.com/quotaworks/quota/transfer"
)

// evaluate computes the audit from one ledger snapshot and the region books read after it.
// stale is true when a region holds a transfer record the snapshot does not know: the
// caller reads again.
func evaluate(snap ledgerSnapshot, books map[string]map[string]regionRead, regions []RegionLink, final bool) (Report, bool) {
	rep := Report{OK: true}
	stale := false
	add := func(v Violation) { rep.Violations = append(rep.Violations, v); rep.OK = false }
	// Each SKU's transfers, found once: the audit's cost grows with the transfers, not with
	// transfers × SKUs.
	bySKU := map[skuKey][]transfer.Transfer{}
	for _, t := range snap.transfers {
		k := skuKey{t.Sale, t.SKU}
		bySKU[k] = append(bySKU[k], t)
	}
	for _, sale := range snap.sales {
		for _, r := range regions {
			rr := books[r.Name][sale]
			if rr.err != nil {
				continue
			}
			for id, rec := range rr.books.Outbound {
				if _, ok := snap.transfers[id]; !ok {
					stale = true
				} else if t := snap.transfers[id]; t.From != r.Name || t.Units != rec.Units || t.SKU != rec.SKU {
					add(Violation{"I5", sale, rec.SKU, r.Name, fmt.Sprintf("transfer %s debited at %s as %d of %s, ledger says %d of %s from %s",
						id, r.Name, rec.Units, rec.SKU, t.Units, t.SKU, t.From)})
				}
			}
			for id, rec := range rr.books.Inbound {
				t, ok := snap.transfers[id]
				if !ok {
					stale = true
					continue
				}
				if t.To != r.Name || t.SKU != rec.SKU || t.Units != rec.Units {
					add(Violation{"I5", sale, rec.SKU, r.Name, fmt.Sprintf("transfer %s recorded at %s as %d of %s, ledger says %d of %s to %s",
						id, r.Name, rec.Units, rec.SKU, t.Units, t.SKU, t.To)})
				}
			}
		}
		for _, k := range snap.skus[sale] {
			a := auditSKU(sale, k, bySKU[skuKey{sale, k.SKU}], books, regions, final, add)
			stale = stale || a.stale
			rep.SKUs = append(rep.SKUs, a)
		}
	}
	return rep, stale
}

func auditSKU(sale string, k SKULedger, transfers []transfer.Transfer, books map[string]map[string]regionRead,
	regions []RegionLink, final bool, add func(Violation)) SKUAudit {
	a := SKUAudit{Sale: sale, SKU: k.SKU, Total: k.Total, Unallocated: k.Unallocated, OK: true}
	bad := func(inv, region, format string, args ...any) {
		a.OK = false
		add(Violation{inv, sale, k.SKU, region, fmt.Sprintf(format, args...)})
	}
	unread := false
	for _, r := range regions {
		rr := books[r.Name][sale]
		ra := RegionAudit{Region: r.Name, Reachable: rr.err == nil}
		if rr.err != nil {
			unread = true
			ra.Error = rr.err.Error()
			bad("I1", r.Name, "region %s could not be read, conservation unproven: %v", r.Name, rr.err)
			a.Regions = append(a.Regions, ra)
			continue
		}
		for _, p := range rr.books.Pools {
			if p.SKU != k.SKU {
				continue
			}
			ra.Available, ra.Held, ra.Sold, ra.CreditedIn, ra.DebitedOut = p.Available, p.Held, p.Sold, p.CreditedIn, p.DebitedOut
			checkPool(p, r.Name, bad)
		}
		a.Available += ra.Available
		a.Held += ra.Held
		a.Sold += ra.Sold
		a.Regions = append(a.Regions, ra)
	}
	for _, t := range transfers {
		inFlight, ok := classify(t, books[t.From][sale], books[t.To][sale], final, bad)
		if !ok {
			a.stale = true
		}
		if inFlight {
			a.InFlight += t.Units
			if t.Stranded {
				a.Stranded += t.Units
			}
		}
	}
	if a.Unallocated < 0 || a.InFlight < 0 {
		bad("I2", "", "negative term: unallocated %d, in flight %d", a.Unallocated, a.InFlight)
	}
	// With a region unread its terms are unknown, not 0: the sum would report units as lost
	// that are only unseen. The unread region is the violation, already reported.
	if sum := a.Unallocated + a.Available + a.Held + a.Sold + a.InFlight; sum != a.Total && !unread {
		bad("I1", "", "total %d != unallocated %d + available %d + held %d + sold %d + in flight %d = %d",
			a.Total, a.Unallocated, a.Available, a.Held, a.Sold, a.InFlight, sum)
	}
	return a
}

// checkPool checks I2 and I3 for one region pool.
func checkPool(p transfer.PoolBooks, region string, bad func(inv, region, format string, args ...any)) {
	if p.Available < 0 || p.Held < 0 || p.Sold < 0 || p.CreditedIn < 0 || p.DebitedOut < 0 {
		bad("I2", region, "negative count in pool %+v", p)
	}
	if p.CreditedIn-p.DebitedOut != p.Available+p.Held+p.Sold {
		bad("I3", region, "credited_in %d - debited_out %d != available %d + held %d + sold %d",
			p.CreditedIn, p.DebitedOut, p.Available, p.Held, p.Sold)
	}
	if p.Held != p.HeldInHolds {
		bad("I3", region, "pool held %d but its held holds sum to %d", p.Held, p.HeldInHolds)
	}
	if p.Sold != p.SoldInHolds {
		bad("I3", region, "pool sold %d but its sold holds sum to %d", p.Sold, p.SoldInHolds)
	}
}

// classify tells whether t's units are in flight (debited at the source, neither credited
// at the destination nor restored at the source), checking I5 on the way. ok is false when
// the snapshots disagree in a way only a later read resolves: the destination credited a
// transfer the source's (earlier) snapshot had not yet debited.
func classify(t transfer.Transfer, src, dst regionRead, final bool, bad func(inv, region, format string, args ...any)) (inFlight, ok bool) {
	var debited, restored, credited bool
	var out transfer.OutboundRecord
	if t.From == transfer.Unallocated {
		debited, restored = t.State == transfer.Pending || t.State == transfer.Posted, false
	} else {
		if src.err != nil {
			return t.State == transfer.Pending, true // the region is reported unreadable already
		}
		var has bool
		out, has = src.books.Outbound[t.ID]
		debited, restored = has && out.State.Debited(), has && out.State == transfer.OutVoided
	}
	if t.To == transfer.Unallocated {
		credited = t.State == transfer.Posted
	} else if dst.err == nil {
		in, has := dst.books.Inbound[t.ID]
		credited = has && in.State == transfer.InCredited
	} else {
		return t.State == transfer.Pending && debited && !restored, true
	}
	region := t.To
	switch {
	case credited && !debited:
		return false, false
	case out.State == transfer.OutSettled && !credited && !final:
		// The source settled after the destination's (or the ledger's) snapshot was taken.
		return debited && !restored, false
	case credited && restored:
		bad("I5", t.From, "transfer %s is both credited at %s and restored at %s", t.ID, t.To, t.From)
	case t.State == transfer.Posted && !credited:
		bad("I5", region, "transfer %s is posted but %s has no credit for it", t.ID, t.To)
	case t.State == transfer.Voided && credited:
		bad("I5", region, "transfer %s is voided but %s credited it", t.ID, t.To)
	case out.State == transfer.OutSettled && !credited:
		bad("I5", t.From, "transfer %s is settled at %s but %s has no credit for it", t.ID, t.From, t.To)
	}
	return debited && !restored && !credited, true
}
