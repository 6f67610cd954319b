package sim

import (
	"fmt"
	"time"

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
	creditReq struct {
		id     int
		req    region.CreditRequest
		refuse bool
	}
	debitReq struct {
		id     int
		req    region.DebitRequest
		refuse bool // RefuseDebit: cancel the requested transfer at its source
	}
	outReq struct {
		id  int
		ref region.TransferRef
		to  transfer.OutState
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
	case creditReq:
		return b.id
	case debitReq:
		return b.id
	case outReq:
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
	gen, before := r.fenceOf(body)
	var res any
	var err error
	switch b := body.(type) {
	case creditReq:
		if b.refuse {
			res, err = r.live.Refuse(b.req)
		} else {
			res, err = r.live.Credit(b.req)
		}
	case debitReq:
		if b.refuse {
			res, err = r.live.RefuseDebit(b.req)
		} else {
			res, err = r.live.Debit(b.req)
		}
	case outReq:
		if b.to == transfer.OutVoided {
			res, err = r.live.Restore(b.ref)
		} else {
			res, err = r.live.Settle(b.ref)
		}
	}
	if err == nil && gen < before {
		w.failf("I4", "region %s accepted %T of generation %d after admitting %d", r.name, body, gen, before)
	}
	return res, err
}

func (r *regionNode) fenceOf(body any) (gen, highest int64) {
	switch b := body.(type) {
	case creditReq:
		return b.req.Generation, r.live.Fence(b.req.Sale)
	case debitReq:
		return b.req.Generation, r.live.Fence(b.req.Sale)
	case outReq:
		return b.ref.Generation, r.live.Fence(b.ref.Sale)
	}
	panic(fmt.Sprintf("sim: %T is not a coordinator request", body))
}
