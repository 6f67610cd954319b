package sim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/transfer"
)

// ledger is the coordinator's durable ledger, with the SQL ledger's semantics: every
// transaction commits all of its writes or none, the generation fence is a row the
// coordinator's driver checks and raises in its transactions (I4), and each statement does
// what its SQL does (coordinator.LedgerTx).
type ledger struct {
	gen         int64
	version     int                       // every commit adds one: the checks skip a step that changed nothing
	total       map[string]transfer.Units // sku → units
	unallocated map[string]transfer.Units
	transfers   map[string]transfer.Transfer
	// bySKU is each SKU's transfer ids, in the order they were created (none is deleted).
	bySKU map[string][]string
	// unsettled is the ids of the transfers unfinished lists (the open ones, by put).
	unsettled map[string]bool
	// touched is the SKUs written since the checks last took it (takeTouched).
	touched map[string]bool
	// undo is the running transaction's journal: what it changed, as it was before (nil
	// outside a transaction).
	undo *ledgerUndo
	// open is unfinished's answer at a version.
	open struct {
		version int
		ts      []transfer.Transfer
		ok      bool
	}
}

// ledgerUndo is what a transaction changed, as it was before it: a failed one puts it back,
// so that its cost is its writes, not the ledger's size.
type ledgerUndo struct {
	gen         int64
	unallocated map[string]transfer.Units
	absent      map[string]bool // SKUs the transaction gave an unallocated row they had not
	transfers   map[string]transfer.Transfer
}

func newLedger() *ledger {
	return &ledger{total: map[string]transfer.Units{}, unallocated: map[string]transfer.Units{},
		transfers: map[string]transfer.Transfer{}, bySKU: map[string][]string{}, unsettled: map[string]bool{},
		touched: map[string]bool{}}
}

// drivable reports whether a coordinator still has to drive t (unfinished, or posted and not settled).
func drivable(t transfer.Transfer) bool {
	return !t.State.Final() || (t.State == transfer.Posted && !t.Settled)
}

// put writes transfer t's row (journaled inside a transaction), keeping the index of the
// unfinished ones and the SKUs touched.
func (l *ledger) put(t transfer.Transfer) {
	if u := l.undo; u != nil {
		if _, ok := u.transfers[t.ID]; !ok {
			old, had := l.transfers[t.ID]
			if !had { // rollback restores rows; it could not take a new one back
				panic("sim: a ledger transaction created transfer " + t.ID + "; transfers are created outside transactions")
			}
			u.transfers[t.ID] = old
		}
	}
	l.restore(t)
}

// restore writes t's row without journaling it.
func (l *ledger) restore(t transfer.Transfer) {
	l.transfers[t.ID] = t
	l.touched[t.SKU] = true
	if drivable(t) {
		l.unsettled[t.ID] = true
	} else {
		delete(l.unsettled, t.ID)
	}
}

// addUnallocated changes sku's unallocated units by delta (journaled inside a transaction).
func (l *ledger) addUnallocated(sku string, delta transfer.Units) {
	if u := l.undo; u != nil {
		if _, ok := u.unallocated[sku]; !ok && !u.absent[sku] {
			if v, had := l.unallocated[sku]; had {
				u.unallocated[sku] = v
			} else {
				u.absent[sku] = true
			}
		}
	}
	l.unallocated[sku] += delta
	l.touched[sku] = true
}

// rollback puts back what the running transaction changed.
func (l *ledger) rollback() {
	u := l.undo
	l.gen = u.gen
	for sku, v := range u.unallocated {
		l.unallocated[sku] = v
	}
	for sku := range u.absent {
		delete(l.unallocated, sku)
	}
	for _, t := range u.transfers { // every one existed before: transactions create none
		l.restore(t)
	}
}

// takeTouched returns the SKUs written since the last call, and forgets them.
func (l *ledger) takeTouched(into map[string]bool) {
	for sku := range l.touched {
		into[sku] = true
	}
	clear(l.touched)
}

// write passes the ledger's fence for generation gen (a one-statement transaction of the
// coordinator's own, outside the driver).
func (l *ledger) write(gen int64) error {
	next, err := transfer.Admit(l.gen, gen)
	if err != nil {
		return err
	}
	l.gen, l.version = next, l.version+1
	return nil
}

// create records a new transfer, requested, as Coordinator.Transfer does (protocol step 1,
// fenced); like its check of the source, it refuses units the unallocated pool visibly
// lacks. The driver takes it on from there.
func (l *ledger) create(gen int64, now time.Time, t transfer.Transfer) error {
	if err := l.write(gen); err != nil {
		return err
	}
	if _, ok := l.transfers[t.ID]; ok {
		return fmt.Errorf("transfer %s exists", t.ID)
	}
	if t.From == transfer.Unallocated && l.unallocated[t.SKU] < t.Units {
		return fmt.Errorf("unallocated %s has %d, not %d", t.SKU, l.unallocated[t.SKU], t.Units)
	}
	t.State, t.Generation, t.CreatedAt = transfer.Requested, gen, now
	l.bySKU[t.SKU] = append(l.bySKU[t.SKU], t.ID)
	l.put(t)
	return nil
}

// unfinished lists the transfers a coordinator still has to drive, by id. The list is
// computed once per ledger version (every write adds one) and must not be changed by the
// caller; a write makes a new one, so a caller may write while it ranges over the old.
func (l *ledger) unfinished() []transfer.Transfer {
	if l.open.ok && l.open.version == l.version {
		return l.open.ts
	}
	var ts []transfer.Transfer
	for _, id := range slices.Sorted(maps.Keys(l.unsettled)) {
		ts = append(ts, l.transfers[id])
	}
	l.open.version, l.open.ts, l.open.ok = l.version, ts, true
	return ts
}

// recent is sku's transfers as the coordinator's openTransfersOf reads them for a plan: the
// unfinished ones (requested or pending) and those posted since fedSince, in the order they
// were created.
func (l *ledger) recent(sku string, fedSince time.Time) []transfer.Transfer {
	var ts []transfer.Transfer
	for _, id := range l.bySKU[sku] {
		if t := l.transfers[id]; !t.State.Final() || (t.State == transfer.Posted && !t.CreatedAt.Before(fedSince)) {
			ts = append(ts, t)
		}
	}
	slices.SortFunc(ts, func(a, b transfer.Transfer) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return ts
}

// skuLedgers is the ledger's rows of skus as the auditor reads them.
func (l *ledger) skuLedgers(skus []string) map[string][]coordinator.SKULedger {
	var ks []coordinator.SKULedger
	for _, sku := range skus {
		ks = append(ks, coordinator.SKULedger{SKU: sku, Total: l.total[sku], Unallocated: l.unallocated[sku]})
	}
	return map[string][]coordinator.SKULedger{sale: ks}
}

// nodeLedger is one coordinator process's connection to the ledger: the coordinator.Ledger
// its driver writes through.
type nodeLedger struct {
	w *world
	c *coordNode
}

// Tx runs fn as one transaction: a failed fn leaves the ledger as it was. A committed
// transaction from a coordinator whose generation is below the fence it found broke I4:
// the fence exists so that a deposed coordinator writes nothing.
func (n nodeLedger) Tx(_ context.Context, fn func(coordinator.LedgerTx) error) error {
	l := n.w.ledger
	gen := l.gen
	l.undo = &ledgerUndo{gen: gen, unallocated: map[string]transfer.Units{}, absent: map[string]bool{},
		transfers: map[string]transfer.Transfer{}}
	err := fn(ledgerTx{l})
	if err != nil {
		l.rollback()
	}
	l.undo = nil
	if err != nil {
		return err
	}
	if n.c.gen < gen {
		n.w.failf("I4", "the ledger committed a write of coordinator %s (generation %d) after admitting generation %d", n.c.name, n.c.gen, gen)
	}
	l.version++
	return nil
}

// Transfer reads one transfer's row.
func (n nodeLedger) Transfer(_ context.Context, id string) (transfer.Transfer, error) {
	t, ok := n.w.ledger.transfers[id]
	if !ok {
		return t, fmt.Errorf("transfer %s: %w", id, coordinator.ErrNotFound)
	}
	return t, nil
}

// ledgerTx is the ledger's statements, each as its SQL in the coordinator does it.
type ledgerTx struct{ l *ledger }

// CheckFence raises the fence row to gen, or refuses a lower generation (I4).
func (x ledgerTx) CheckFence(gen int64) error {
	next, err := transfer.Admit(x.l.gen, gen)
	if err != nil {
		return fmt.Errorf("ledger: %w: %w", coordinator.ErrFenced, err)
	}
	x.l.gen = next
	return nil
}

// AddUnallocated is the conditional update: unallocated never falls below zero.
func (x ledgerTx) AddUnallocated(s, sku string, delta transfer.Units) (bool, error) {
	if s != sale || x.l.unallocated[sku]+delta < 0 {
		return false, nil
	}
	x.l.addUnallocated(sku, delta)
	return true, nil
}

// SetState moves a transfer guarded on the state it was read in.
func (x ledgerTx) SetState(id string, from, next transfer.State, reason string, settled bool, _ time.Time) (bool, error) {
	t, ok := x.l.transfers[id]
	if !ok || t.State != from {
		return false, nil
	}
	t.State, t.Stranded, t.Reason, t.Settled = next, false, reason, settled
	x.l.put(t)
	return true, nil
}

// SetReason records why an unfinished transfer waits.
func (x ledgerTx) SetReason(id, reason string, _ time.Time) error {
	if t, ok := x.l.transfers[id]; ok && !t.State.Final() {
		t.Reason = reason
		x.l.put(t)
	}
	return nil
}

// Strand flags an unfinished transfer stranded.
func (x ledgerTx) Strand(id, reason string, _ time.Time) error {
	if t, ok := x.l.transfers[id]; ok && !t.State.Final() {
		t.Stranded, t.Reason = true, reason
		x.l.put(t)
	}
	return nil
}

// SetSettled marks a transfer settled (the SQL has no guard on the state either).
func (x ledgerTx) SetSettled(id string) error {
	if t, ok := x.l.transfers[id]; ok {
		t.Settled = true
		x.l.put(t)
	}
	return nil
}
