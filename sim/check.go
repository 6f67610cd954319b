package sim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// check judges the durable state after a step: the auditor's rules over the ledger and
// every region's durable books (I1, I2, I3, I5; final: nothing may be in flight), and for
// each region that committed this step, every acknowledged hold and the per-user limit.
func (w *world) check(final bool) {
	if w.fail != nil {
		return
	}
	changed := final || w.ledger.version != w.checked
	for _, r := range w.regions {
		changed = changed || r.dirty
	}
	if !changed {
		return // nothing durable moved since the last check
	}
	w.checked = w.ledger.version
	books := map[string]map[string]transfer.RegionBooks{}
	for _, name := range regionNames {
		r := w.regions[name]
		if r.dirty || r.books.Pools == nil {
			r.books = r.durable.Books(sale)
		}
		books[name] = map[string]transfer.RegionBooks{sale: r.books}
	}
	// The ledger's transfers as they are: EvaluateSnapshot only reads them.
	rep := coordinator.EvaluateSnapshot(w.ledger.skuLedgers(), w.ledger.transfers, books, final)
	if !rep.OK {
		var lines []string // sorted: the auditor visits maps, and a replay must print the same
		for _, v := range rep.Violations {
			lines = append(lines, fmt.Sprintf("\n  %s %s/%s %s: %s", v.Invariant, v.Sale, v.SKU, v.Region, v.Detail))
		}
		slices.Sort(lines)
		w.failf("audit", "the auditor's rules fail:%s", strings.Join(lines, ""))
		return
	}
	if final {
		for _, a := range rep.SKUs {
			if a.InFlight != 0 || a.Unallocated+a.Available+a.Held+a.Sold != a.Total {
				w.failf("I1", "final audit of %s: %+v", a.SKU, a)
			}
		}
	}
	for _, name := range regionNames {
		if r := w.regions[name]; r.dirty || final {
			r.dirty = false
			w.checkHolds(r)
		}
	}
}

// userSKU is one buyer's count of one SKU.
type userSKU struct{ sku, user string }

// dupKey is one buyer's idempotency key.
type dupKey struct{ user, key string }

// checkScratch is checkHolds' working memory, kept from one check to the next.
type checkScratch struct {
	used   map[userSKU][2]transfer.Units
	perKey map[dupKey]string
}

// checkHolds checks I6 (every acknowledged hold is in the durable image, with every
// acknowledged outcome) and I2's per-user limit, recomputed from the holds and compared
// with the writer's own counts.
func (w *world) checkHolds(r *regionNode) {
	for _, id := range w.store.byRegion[r.name] {
		a := w.store.holds[id]
		h, ok := r.durable.HoldByID(id)
		switch {
		case !ok:
			w.failf("I6", "acknowledged hold %s is not in region %s's durable state", id, r.name)
		case h.User != a.hold.User || h.Quantity != a.hold.Quantity || h.SKU != a.hold.SKU:
			w.failf("I6", "hold %s is stored as %+v, acknowledged as %+v", id, h, a.hold)
		case a.state != region.Held && (h.State != a.state || h.PaymentID != a.payment):
			w.failf("I6", "hold %s acknowledged %s (payment %q) is stored %s (payment %q)", id, a.state, a.payment, h.State, h.PaymentID)
		}
		if w.fail != nil {
			return
		}
	}
	used, perKey := w.scratch.used, w.scratch.perKey // emptied, their room kept: no growth step after step
	clear(used)
	clear(perKey)
	var dups []string
	r.durable.EachHold(func(h region.Hold) {
		k := dupKey{h.User, h.RequestKey}
		if other, ok := perKey[k]; ok {
			a, b := min(other, h.ID), max(other, h.ID)
			dups = append(dups, fmt.Sprintf("request key %s/%s has two holds in region %s: %s and %s", h.User, h.RequestKey, r.name, a, b))
		}
		perKey[k] = h.ID
		u := used[userSKU{h.SKU, h.User}]
		switch h.State {
		case region.Held:
			u[0] += h.Quantity
		case region.Sold:
			u[1] += h.Quantity
		}
		used[userSKU{h.SKU, h.User}] = u
	})
	if len(dups) > 0 { // the holds were visited in no particular order: report the first in order
		w.failf("I6", "%s", slices.Min(dups))
		return
	}
	var bad []userSKU
	for k, u := range used {
		held, bought := r.durable.UserCount(sale, k.sku, k.user)
		if held != u[0] || bought != u[1] || u[0]+u[1] > 3 {
			bad = append(bad, k)
		}
	}
	// Only a breach is sorted, so that a replay reports the same one first.
	slices.SortFunc(bad, func(a, b userSKU) int { return cmp.Or(strings.Compare(a.sku, b.sku), strings.Compare(a.user, b.user)) })
	for _, k := range bad {
		u := used[k]
		held, bought := r.durable.UserCount(sale, k.sku, k.user)
		if held != u[0] || bought != u[1] {
			w.failf("I3", "region %s user %s %s: counts held %d bought %d, holds say %d and %d", r.name, k.user, k.sku, held, bought, u[0], u[1])
		}
		if u[0]+u[1] > 3 {
			w.failf("I2", "region %s user %s has %d of %s, over the limit 3", r.name, k.user, u[0]+u[1], k.sku)
		}
	}
}
