package sim

import (
	"fmt"
	"time"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// call is a coordinator request awaiting its answer: the step it asks for, and the ledger
// state and generation it was asked from. An answer is acted on only while both still hold,
// as the coordinator's driver does (it reads, asks, then writes fenced).
type call struct {
	transfer string
	kind     string
	state    transfer.State
	gen      int64
}

// coordNode is one coordinator process. It leads with generation gen (0: it does not); after
// losing its lease it may go on as a zombie until zombieUntil, its requests carrying the old
// generation: the regions' and the ledger's fences must make them change nothing (I4).
type coordNode struct {
	name        string
	gen         int64
	zombieUntil time.Time
	waiting     map[int]call
	asked       map[string]time.Time // transfer → when its last request was sent
}

func newCoordNode(name string) *coordNode { return &coordNode{name: name} }

// lead makes the node leader with generation gen and a fresh memory.
func (c *coordNode) lead(gen int64) {
	c.gen, c.zombieUntil, c.waiting, c.asked = gen, time.Time{}, map[int]call{}, map[string]time.Time{}
}

// depose ends the node's leadership: at once (crashed), or after zombie time (paused past
// its lease, it does not know yet).
func (c *coordNode) depose(now time.Time, zombie time.Duration) {
	if zombie <= 0 {
		c.gen = 0
		return
	}
	c.zombieUntil = now.Add(zombie)
}

func (c *coordNode) leading(w *world) bool {
	if c.gen == 0 {
		return false
	}
	if !c.zombieUntil.IsZero() && !w.now.Before(c.zombieUntil) {
		c.gen = 0
		return false
	}
	return true
}

// turn drives every unfinished transfer one step, asking again once an answer is overdue,
// and flags those unfinished for longer than strandAfter.
func (c *coordNode) turn(w *world) {
	if !c.leading(w) {
		return
	}
	for _, t := range w.ledger.unfinished() {
		if at, ok := c.asked[t.ID]; ok && w.now.Sub(at) < callTimeout {
			continue
		}
		if !t.Stranded && !t.State.Final() && w.now.Sub(t.CreatedAt) > strandAfter {
			if w.ledger.write(c.gen) != nil {
				c.gen = 0
				return
			}
			t.Stranded, t.Reason = true, fmt.Sprintf("no answer for %s", strandAfter)
			w.stats.Ops["transfer stranded"]++
		}
		c.ask(w, t)
	}
}

func (c *coordNode) ask(w *world, t *transfer.Transfer) {
	c.asked[t.ID] = w.now
	id := w.nextID()
	switch {
	case t.State == transfer.Requested:
		refuse := w.ledger.refuse[t.ID] && !w.ledger.refusedDebit[t.ID]
		if refuse {
			w.ledger.refusedDebit[t.ID] = true
		}
		c.waiting[id] = call{t.ID, "debit", t.State, c.gen}
		w.send(c.name, t.From, debitReq{id, region.DebitRequest{Generation: c.gen, TransferID: t.ID, Sale: t.Sale, SKU: t.SKU, To: t.To, Units: t.Units}, refuse})
	case t.State == transfer.Pending:
		refuse := w.ledger.refuse[t.ID]
		c.waiting[id] = call{t.ID, "credit", t.State, c.gen}
		w.send(c.name, t.To, creditReq{id, region.CreditRequest{Generation: c.gen, TransferID: t.ID, Sale: t.Sale, SKU: t.SKU, Units: t.Units}, refuse})
	case t.State == transfer.Posted:
		c.waiting[id] = call{t.ID, "settle", t.State, c.gen}
		w.send(c.name, t.From, outReq{id, region.TransferRef{Generation: c.gen, TransferID: t.ID, Sale: t.Sale}, transfer.OutSettled})
	}
}

// receive acts on an answer (transfer.AfterDebit, AfterCredit, then the ledger through
// transfer.Next).
func (c *coordNode) receive(w *world, m message) {
	rep, ok := m.body.(reply)
	if !ok {
		return
	}
	cl, ok := c.waiting[rep.id]
	delete(c.waiting, rep.id)
	if !ok || !c.leading(w) || cl.gen != c.gen {
		return
	}
	t := w.ledger.transfers[cl.transfer]
	if rep.err != nil || t.State != cl.state {
		if rep.err != nil {
			w.stats.Ops["coordinator step refused"]++
		}
		return
	}
	before, settled := t.State, t.Settled
	var err error
	switch cl.kind {
	case "debit":
		err = c.onDebit(w, t, rep.res.(transfer.OutState))
	case "credit":
		err = c.onCredit(w, t, rep.res.(transfer.InState))
	case "restore":
		if rep.res.(transfer.OutState) == transfer.OutVoided {
			err = w.ledger.advance(w, c.gen, t.ID, transfer.Refused)
		}
	case "settle":
		if rep.res.(transfer.OutState) == transfer.OutSettled {
			if err = w.ledger.write(c.gen); err == nil {
				t.Settled = true
			}
		}
	}
	if err != nil {
		c.gen = 0 // fenced: a newer coordinator leads
		return
	}
	if t.State != before || t.Settled != settled {
		delete(c.asked, t.ID) // the next step goes out on the next turn
	}
}

func (c *coordNode) onDebit(w *world, t *transfer.Transfer, st transfer.OutState) error {
	ev, err := transfer.AfterDebit(st)
	if err != nil {
		return nil // decides nothing: asked again, stranded if it lasts
	}
	return w.ledger.advance(w, c.gen, t.ID, ev)
}

// onCredit posts a credited transfer; a refused one is voided only once the source has
// restored its units (I5: restore never before the durable refusal, never both).
func (c *coordNode) onCredit(w *world, t *transfer.Transfer, st transfer.InState) error {
	ev, err := transfer.AfterCredit(st)
	if err != nil {
		return nil
	}
	if ev == transfer.Refused && t.From != transfer.Unallocated {
		id := w.nextID()
		c.waiting[id] = call{t.ID, "restore", t.State, c.gen}
		c.asked[t.ID] = w.now
		w.send(c.name, t.From, outReq{id, region.TransferRef{Generation: c.gen, TransferID: t.ID, Sale: t.Sale}, transfer.OutVoided})
		return nil
	}
	return w.ledger.advance(w, c.gen, t.ID, ev)
}
