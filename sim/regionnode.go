package sim

import (
	"fmt"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// Requests a region serves, and its reply.
type (
	reserveReq struct {
		id  int
		req region.ReserveRequest
	}
	confirmReq struct {
		id            int
		hold, payment string
	}
	releaseReq struct {
		id   int
		hold string
	}
	// coordReq is a participant call of the coordinator's driver.
	coordReq struct {
		id   int
		call coordinator.Call
	}
	reply struct {
		id      int
		region  string
		res     any
		err     error
		decided time.Time
	}
)

// regionNode is one region's leader process: its memory (live), its database (durable),
// and the requests that arrived since its last batch.
type regionNode struct {
	name          string
	live, durable *region.Core
	up            bool
	downUntil     time.Time
	inbox         []message
	holdSeq       int
	lastSweep     time.Time
	// dirty: the durable image changed this step, so its holds are checked (I6) and its
	// books read again.
	dirty bool
	books transfer.RegionBooks
}

func newRegionNode(name string) *regionNode {
	c := region.NewCore(name)
	return &regionNode{name: name, live: c, durable: c.Clone(), up: true, lastSweep: epoch}
}

func (r *regionNode) receive(m message) {
	if r.up {
		r.inbox = append(r.inbox, m)
	}
}

// turn decides what arrived since the last turn (and a sweep, when due) as one batch, then
// commits it and only then replies (I6), unless the nemesis crashes the process between
// the decisions and the commit: then the batch and its replies are lost and the process
// restarts from its durable image.
func (r *regionNode) turn(w *world) {
	if !r.up {
		if !w.now.Before(r.downUntil) {
			r.up, r.live = true, r.durable.Restarted()
			w.stats.Ops["region restart"]++
		}
		return
	}
	sweep := w.now.Sub(r.lastSweep) >= sweepEvery
	if len(r.inbox) == 0 && !sweep {
		return
	}
	batch := r.inbox
	r.inbox = nil
	var replies []message
	for _, m := range batch {
		res, err := r.apply(w, m.body)
		id := requestID(m.body)
		replies = append(replies, message{from: r.name, to: m.from, body: reply{id: id, region: r.name, res: res, err: err, decided: w.now}})
	}
	if sweep {
		r.lastSweep = w.now
		if n := r.live.Expire(w.now, 1000); n > 0 {
			w.stats.Ops["hold expired"] += n
		}
	}
	if w.faults && w.chance(0.004) {
		w.stats.Faults["region crash before commit"]++
		r.crash(w)
		return
	}
	r.durable, r.dirty = r.live.Clone(), true
	for _, m := range replies {
		w.send(m.from, m.to, m.body)
	}
}

// crash loses the process's memory; it restarts from its durable image a little later.
func (r *regionNode) crash(w *world) {
	r.up, r.inbox, r.live = false, nil, nil
	r.downUntil = w.now.Add(w.between(100*time.Millisecond, 3*time.Second))
}

func requestID(body any) int {
	switch b := body.(type) {
	case reserveReq:
		return b.id
	case confirmReq:
		return b.id
	case releaseReq:
		return b.id
	case coordReq:
		return b.id
	}
	panic(fmt.Sprintf("sim: request %T has no id", body))
}

// apply runs one request against the live Core. A coordinator request is checked against
// I4 here: the Core must refuse a generation below the highest it has admitted.
func (r *regionNode) apply(w *world, body any) (any, error) {
	switch b := body.(type) {
	case reserveReq:
		r.holdSeq++
		return r.live.Reserve(w.now, b.req, fmt.Sprintf("%s-h%d", r.name, r.holdSeq))
	case confirmReq:
		before, _ := r.live.HoldByID(b.hold)
		res, err := r.live.Confirm(w.now, b.hold, b.payment)
		if err == nil && res.Sold && before.State == region.Held && !w.now.Before(before.ExpiresAt) {
			w.failf("I6", "confirm sold hold %s at %s, at or after its deadline %s", b.hold, w.now.Sub(epoch), before.ExpiresAt.Sub(epoch))
		}
		return res, err
	case releaseReq:
		return r.live.Release(w.now, b.hold)
	}
	call := body.(coordReq).call
	before := r.live.Fence(call.Transfer.Sale)
	res, err := r.participant(call)
	if err == nil && call.Generation < before {
		w.failf("I4", "region %s accepted a %s of generation %d after admitting %d", r.name, call.Kind, call.Generation, before)
	}
	return res, err
}

// participant runs a coordinator call against the live Core, as the region's participant
// service runs it against its writer.
func (r *regionNode) participant(call coordinator.Call) (any, error) {
	t, gen := call.Transfer, call.Generation
	credit := region.CreditRequest{Generation: gen, TransferID: t.ID, Sale: t.Sale, SKU: t.SKU, Units: t.Units}
	debit := region.DebitRequest{Generation: gen, TransferID: t.ID, Sale: t.Sale, SKU: t.SKU, To: t.To, Units: t.Units}
	ref := region.TransferRef{Generation: gen, TransferID: t.ID, Sale: t.Sale}
	switch call.Kind {
	case coordinator.CallCredit:
		return r.live.Credit(credit)
	case coordinator.CallRefuse:
		return r.live.Refuse(credit)
	case coordinator.CallDebit:
		return r.live.Debit(debit)
	case coordinator.CallRefuseDebit:
		return r.live.RefuseDebit(debit)
	case coordinator.CallRestore:
		return r.live.Restore(ref)
	case coordinator.CallSettle:
		return r.live.Settle(ref)
	}
	panic(fmt.Sprintf("sim: coordinator call %q", call.Kind))
}
