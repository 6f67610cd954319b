package sim

import (
	"fmt"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/transfer"
)

// ledger is the coordinator's durable ledger: every write is fenced by the writer's
// generation (I4), and a transfer moves only through transfer.Next.
type ledger struct {
	gen         int64
	version     int                       // every write adds one: the checks skip a step that changed nothing
	total       map[string]transfer.Units // sku → units
	unallocated map[string]transfer.Units
	transfers   map[string]*transfer.Transfer
	// refuse marks the transfers an operator resolved with --refuse: the coordinator asks
	// the destination to refuse them instead of crediting.
	refuse map[string]bool
	// refusedDebit marks the requested transfers whose RefuseDebit has been sent once: a
	// resolve asks once, and later attempts are the driver's plain Debits, which must meet
	// the source's tombstone (I5).
	refusedDebit map[string]bool
}

func newLedger() *ledger {
	return &ledger{total: map[string]transfer.Units{}, unallocated: map[string]transfer.Units{},
		transfers: map[string]*transfer.Transfer{}, refuse: map[string]bool{}, refusedDebit: map[string]bool{}}
}

// write passes the ledger's fence for generation gen.
func (l *ledger) write(gen int64) error {
	next, err := transfer.Admit(l.gen, gen)
	if err != nil {
		return err
	}
	l.gen, l.version = next, l.version+1
	return nil
}

// create records a new transfer. From the unallocated pool the ledger debits the units in
// the same write, so the transfer starts pending (I1: unallocated → in flight).
func (l *ledger) create(gen int64, now time.Time, t transfer.Transfer) error {
	if err := l.write(gen); err != nil {
		return err
	}
	if _, ok := l.transfers[t.ID]; ok {
		return fmt.Errorf("transfer %s exists", t.ID)
	}
	t.State, t.Generation, t.CreatedAt = transfer.Requested, gen, now
	if t.From == transfer.Unallocated {
		if l.unallocated[t.SKU] < t.Units {
			return fmt.Errorf("unallocated %s has %d, not %d", t.SKU, l.unallocated[t.SKU], t.Units)
		}
		l.unallocated[t.SKU] -= t.Units
		t.State = transfer.Pending
	}
	l.transfers[t.ID] = &t
	return nil
}

// advance records event ev of transfer id. The transition must be in transfer.Next's
// table: one that is not is a coordinator bug. A transfer from the unallocated pool voided
// by the destination's refusal gets its units back in the same write.
func (l *ledger) advance(w *world, gen int64, id string, ev transfer.Event) error {
	if err := l.write(gen); err != nil {
		return err
	}
	t := l.transfers[id]
	next, err := transfer.Next(t.State, ev)
	if err != nil {
		w.failf("I5", "coordinator: transfer %s: %v", id, err)
		return err
	}
	if next == transfer.Voided && t.State == transfer.Pending && t.From == transfer.Unallocated {
		l.unallocated[t.SKU] += t.Units
	}
	if next == transfer.Posted && t.From == transfer.Unallocated {
		t.Settled = true
	}
	t.State = next
	return nil
}

// unfinished lists the transfers a coordinator still has to drive, by id.
func (l *ledger) unfinished() []*transfer.Transfer {
	var ts []*transfer.Transfer
	for _, id := range sortedKeys(l.transfers) {
		if t := l.transfers[id]; !t.State.Final() || (t.State == transfer.Posted && !t.Settled) {
			ts = append(ts, t)
		}
	}
	return ts
}

// skuLedgers is the ledger's SKUs as the auditor reads them.
func (l *ledger) skuLedgers() map[string][]coordinator.SKULedger {
	var ks []coordinator.SKULedger
	for _, sku := range skus {
		ks = append(ks, coordinator.SKULedger{SKU: sku, Total: l.total[sku], Unallocated: l.unallocated[sku]})
	}
	return map[string][]coordinator.SKULedger{sale: ks}
}

func (l *ledger) snapshot() map[string]transfer.Transfer {
	m := make(map[string]transfer.Transfer, len(l.transfers))
	for id, t := range l.transfers {
		m[id] = *t
	}
	return m
}
