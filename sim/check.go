package sim

import (
	"fmt"
	"maps"
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
	rep := coordinator.EvaluateSnapshot(w.ledger.skuLedgers(), w.ledger.snapshot(), books, final)
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
	type uk struct{ sku, user string }
	used := map[uk][2]transfer.Units{}
	perKey := map[string]string{}
	r.durable.EachHold(func(h region.Hold) {
		if other, ok := perKey[h.User+"/"+h.RequestKey]; ok && w.fail == nil {
			a, b := min(other, h.ID), max(other, h.ID)
			w.failf("I6", "request key %s/%s has two holds in region %s: %s and %s", h.User, h.RequestKey, r.name, a, b)
		}
		perKey[h.User+"/"+h.RequestKey] = h.ID
		u := used[uk{h.SKU, h.User}]
		switch h.State {
		case region.Held:
			u[0] += h.Quantity
		case region.Sold:
			u[1] += h.Quantity
		}
		used[uk{h.SKU, h.User}] = u
	})
	keys := slices.SortedFunc(maps.Keys(used), func(a, b uk) int { return strings.Compare(a.sku+"/"+a.user, b.sku+"/"+b.user) })
	for _, k := range keys {
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
