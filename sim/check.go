package sim

import (
	"cmp"
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
// The auditor's rules judge every SKU at least every shape.fullEvery steps and at the end;
// the checks in between judge the SKUs whose ledger rows, pools or transfer records
// changed since the last check, which is all a step can have broken.
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
	w.ledger.takeTouched(w.touched)
	for _, name := range w.shape.regions {
		if r := w.regions[name]; r.dirty || r.books.Pools == nil {
			r.readBooks(w.touched)
		}
	}
	whole := final || w.shape.fullEvery <= 1 || w.step-w.full >= w.shape.fullEvery
	var rep coordinator.Report
	if whole {
		w.full = w.step
		rep = w.evaluate(w.shape.skus, final)
	} else if len(w.touched) > 0 {
		rep = w.evaluate(slices.Sorted(maps.Keys(w.touched)), false)
	} else {
		rep.OK = true
	}
	clear(w.touched)
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
	for _, name := range w.shape.regions {
		if r := w.regions[name]; r.dirty || final {
			r.dirty = false
			w.checkHolds(r)
			w.checkCarts(r)
		}
	}
}

// evaluate runs the auditor's rules (coordinator.EvaluateSnapshot) over skus: their ledger
// rows and transfers, and every region's pools and transfer records of them. Over every SKU
// it hands the auditor the ledger's transfers as they are (it only reads them).
func (w *world) evaluate(skus []string, final bool) coordinator.Report {
	books := map[string]map[string]transfer.RegionBooks{}
	if len(skus) == len(w.shape.skus) {
		for _, name := range w.shape.regions {
			books[name] = map[string]transfer.RegionBooks{sale: w.regions[name].books}
		}
		return coordinator.EvaluateSnapshot(w.ledger.skuLedgers(skus), w.ledger.transfers, books, final)
	}
	ts := map[string]transfer.Transfer{}
	for _, sku := range skus {
		for _, id := range w.ledger.bySKU[sku] {
			ts[id] = w.ledger.transfers[id]
		}
	}
	for _, name := range w.shape.regions {
		books[name] = map[string]transfer.RegionBooks{sale: w.regions[name].booksOf(skus, w.ledger)}
	}
	return coordinator.EvaluateSnapshot(w.ledger.skuLedgers(skus), ts, books, final)
}

// readBooks reads the region's durable books again, and adds to touched every SKU whose
// pool or transfer records are not as they were.
func (r *regionNode) readBooks(touched map[string]bool) {
	old, nb := r.books, r.durable.Books(sale)
	i, j := 0, 0 // both pool lists are in SKU order (one sale): walk them side by side
	for i < len(old.Pools) || j < len(nb.Pools) {
		switch {
		case j == len(nb.Pools) || (i < len(old.Pools) && old.Pools[i].SKU < nb.Pools[j].SKU):
			touched[old.Pools[i].SKU] = true
			i++
		case i == len(old.Pools) || nb.Pools[j].SKU < old.Pools[i].SKU:
			touched[nb.Pools[j].SKU] = true
			j++
		default:
			if old.Pools[i] != nb.Pools[j] {
				touched[nb.Pools[j].SKU] = true
			}
			i, j = i+1, j+1
		}
	}
	diffRecords(old.Inbound, nb.Inbound, func(rec transfer.InboundRecord) string { return rec.SKU }, touched)
	diffRecords(old.Outbound, nb.Outbound, func(rec transfer.OutboundRecord) string { return rec.SKU }, touched)
	r.books = nb
}

// diffRecords adds to touched the SKU of every record added, changed (its SKU before and
// after) or removed between old and next.
func diffRecords[R comparable](old, next map[string]R, sku func(R) string, touched map[string]bool) {
	kept := 0
	for id, rec := range next {
		o, ok := old[id]
		if ok {
			kept++
		}
		if !ok || o != rec {
			touched[sku(rec)] = true
		}
		if ok && o != rec {
			touched[sku(o)] = true
		}
	}
	if kept == len(old) {
		return
	}
	for id, o := range old {
		if _, ok := next[id]; !ok {
			touched[sku(o)] = true
		}
	}
}

// booksOf is the region's books of skus alone: their pools, and the records of their
// transfers in the ledger (a record of no transfer the ledger has is the whole check's to
// find: the auditor calls that a stale read).
func (r *regionNode) booksOf(skus []string, l *ledger) transfer.RegionBooks {
	b := transfer.RegionBooks{Region: r.books.Region, Inbound: map[string]transfer.InboundRecord{},
		Outbound: map[string]transfer.OutboundRecord{}}
	for _, sku := range skus {
		if i, ok := slices.BinarySearchFunc(r.books.Pools, sku, func(p transfer.PoolBooks, s string) int { return strings.Compare(p.SKU, s) }); ok {
			b.Pools = append(b.Pools, r.books.Pools[i])
		}
		for _, id := range l.bySKU[sku] {
			if rec, ok := r.books.Inbound[id]; ok {
				b.Inbound[id] = rec
			}
			if rec, ok := r.books.Outbound[id]; ok {
				b.Outbound[id] = rec
			}
		}
	}
	return b
}

// userSKU is one buyer's count of one SKU.
type userSKU struct{ sku, user string }

// dupKey is one buyer's idempotency key.
type dupKey struct{ user, key string }

// checkScratch is checkHolds' working memory, kept from one check to the next.
type checkScratch struct {
	used   map[userSKU][2]transfer.Units
	perKey map[dupKey]string
	carts  map[string]cartSeen
}

// cartSeen is what a region's durable image has of one cart: its lines' holds, how many are
// sold, and the user and request key (line 0's, the cart's own) it was asked with.
type cartSeen struct {
	lines, sold int
	user, key   string
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

// checkCarts checks I10 on a region's durable image: every cart has a hold for each line it
// was asked with, or none (a refused cart leaves no line held), and its lines are sold all
// together or not at all.
func (w *world) checkCarts(r *regionNode) {
	if w.fail != nil {
		return
	}
	seen := w.scratch.carts
	clear(seen)
	r.durable.EachHold(func(h region.Hold) {
		if h.CartID == "" {
			return
		}
		c := seen[h.CartID]
		c.lines++
		if h.State == region.Sold {
			c.sold++
		}
		if h.ID == h.CartID { // line 0: its hold id is the cart id, its key the cart's
			c.user, c.key = h.User, h.RequestKey
		}
		seen[h.CartID] = c
	})
	var bad []string
	for id, c := range seen {
		k := w.store.keys[c.user+"/"+c.key]
		switch {
		case k == nil || k.cart == nil:
			bad = append(bad, fmt.Sprintf("cart %s in region %s has no line 0 of a cart the storefronts asked for", id, r.name))
		case c.lines != len(k.cart.Lines):
			bad = append(bad, fmt.Sprintf("cart %s of key %s/%s has %d of its %d lines held in region %s", id, c.user, c.key, c.lines, len(k.cart.Lines), r.name))
		case c.sold != 0 && c.sold != c.lines:
			bad = append(bad, fmt.Sprintf("cart %s in region %s has %d of its %d lines sold", id, r.name, c.sold, c.lines))
		}
	}
	if len(bad) > 0 { // visited in no particular order: report the first in order
		w.failf("I10", "%s", slices.Min(bad))
	}
}
