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
	// cartReq reserves a cart; cartCloseReq confirms it (payment set) or releases it.
	cartReq struct {
		id  int
		req region.CartRequest
	}
	cartCloseReq struct {
		id            int
		cart, payment string
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

// leaderProc is one process leading a region: its memory, the requests that arrived since
// its last batch, and the epoch it raised when it took the lead.
type leaderProc struct {
	live      *region.Core
	epoch     int64
	inbox     []message
	lastSweep time.Time
}

// regionNode is one region: its database (the durable image and the epoch row its writers'
// batches are fenced by), its leader process, and after a change of leader the deposed one,
// which goes on deciding for a while before it learns it lost the lead.
type regionNode struct {
	name      string
	durable   *region.Core
	epochRow  int64 // the leader_epoch row: the epoch of the leader whose batches commit
	leader    *leaderProc
	up        bool
	downUntil time.Time
	// deposed is the previous leader, still running until deposedUntil: its batches must
	// commit nothing (the epoch fence, I4), so none of its answers is a promise (I6).
	deposed      *leaderProc
	deposedUntil time.Time
	holdSeq      int // hold ids are unique across the region's processes, as random ids are
	// dirty: the durable image changed this step, so its holds are checked (I6) and its
	// books read again.
	dirty bool
	books transfer.RegionBooks
}

// staleRoute is the share of a region's requests that still reach its deposed leader (a
// client or coordinator that has not learned of the new one).
const staleRoute = 0.5

func newRegionNode(name string) *regionNode {
	c := region.NewCore(name)
	return &regionNode{name: name, durable: c.Clone(), epochRow: 1, leader: &leaderProc{live: c, epoch: 1, lastSweep: epoch}, up: true}
}

// receive queues a request at the process it reaches: the leader, or now and then a deposed
// leader still running.
func (r *regionNode) receive(w *world, m message) {
	if r.deposed != nil && w.chance(staleRoute) {
		r.deposed.inbox = append(r.deposed.inbox, m)
		return
	}
	if r.up {
		r.leader.inbox = append(r.leader.inbox, m)
	}
}

// turn is the region's step: the deposed leader's turn, if one still runs; then the
// leader's, which decides what arrived since its last turn (and a sweep, when due) as one
// batch, then commits it and only then replies (I6), unless the nemesis crashes the process
// between the decisions and the commit: then the batch and its replies are lost and the
// process restarts from the durable image, with the next epoch.
func (r *regionNode) turn(w *world) {
	r.turnDeposed(w)
	if !r.up {
		if !w.now.Before(r.downUntil) {
			r.up = true
			r.lead(w)
			w.stats.Ops["region restart"]++
		}
		return
	}
	replies, ok := r.decide(w, r.leader)
	if !ok {
		return
	}
	if w.faults && w.chance(0.004) {
		w.stats.Faults["region crash before commit"]++
		r.crash(w)
		return
	}
	if err := r.commit(w, r.leader, replies); err != nil {
		w.failf("I4", "region %s: its leader's batch (epoch %d) was fenced with no newer leader: %v", r.name, r.leader.epoch, err)
	}
}

// lead starts a leader process as region.Lead does: it raises the epoch row
// (fencing.RaiseEpoch: from now on every batch of an older leader commits nothing), then
// loads the durable image (I4: the fence rises before the new leader reads or serves).
func (r *regionNode) lead(w *world) {
	r.epochRow++
	r.leader = &leaderProc{live: r.durable.Restarted(), epoch: r.epochRow, lastSweep: w.now}
}

// changeLeader makes a new process lead the region while the old one, deposed but not
// knowing it yet (paused past its lease, cut off from etcd), runs on for d: it keeps deciding
// the requests that still reach it and submitting its batches, coordinator steps included.
func (r *regionNode) changeLeader(w *world, d time.Duration) {
	r.deposed, r.deposedUntil = r.leader, w.now.Add(d)
	r.lead(w)
	w.stats.Faults["region leader change (deposed leader runs on)"]++
}

// turnDeposed is the deposed leader's turn. It stops once it learns it lost the lead, its
// unanswered requests left to their callers' timeouts; before that it decides batches on its
// own memory and submits them, every one of which the epoch fence must refuse. It does not
// stop at the first refusal, as region.recoverFrom would make it: that stands for the
// batches already in its pipeline, and for a fence that must hold however long the old
// leader goes on.
func (r *regionNode) turnDeposed(w *world) {
	p := r.deposed
	if p == nil {
		return
	}
	if !w.now.Before(r.deposedUntil) {
		r.deposed = nil
		return
	}
	replies, ok := r.decide(w, p)
	if !ok {
		return
	}
	if err := r.commit(w, p, replies); err != nil {
		w.stats.Ops["region batch fenced (deposed leader)"]++
		w.stats.Ops["request answered not-leader (fenced batch)"] += len(replies)
	}
}

// decide runs what arrived at p since its last batch (and a sweep, when due) against its
// memory, and returns the replies the batch will send once committed.
func (r *regionNode) decide(w *world, p *leaderProc) ([]message, bool) {
	sweep := w.now.Sub(p.lastSweep) >= sweepEvery
	if len(p.inbox) == 0 && !sweep {
		return nil, false
	}
	batch := p.inbox
	p.inbox = nil
	var replies []message
	for _, m := range batch {
		res, err := r.apply(w, p.live, m.body)
		id := requestID(m.body)
		replies = append(replies, message{from: r.name, to: m.from, body: reply{id: id, region: r.name, res: res, err: err, decided: w.now}})
	}
	if sweep {
		p.lastSweep = w.now
		if n := p.live.Expire(w.now, 1000); n > 0 {
			w.stats.Ops["hold expired"] += n
		}
	}
	return replies, true
}

// commit is p's batch at the region's database. The epoch fence comes first, by the rule
// the writer's SQL applies (transfer.CurrentEpoch, I4): a batch of a leader whose epoch is
// no longer the recorded one commits nothing, and every request of it is told NOT_LEADER
// (region.batchAnswer: none is told it succeeded, I6). A committed batch becomes the durable
// image, and only then are its decisions answered (I6).
func (r *regionNode) commit(w *world, p *leaderProc, replies []message) error {
	if err := transfer.CurrentEpoch(r.epochRow, p.epoch); err != nil {
		for _, m := range replies {
			rep := m.body.(reply)
			rep.res, rep.err = nil, fmt.Errorf("region %s: %w: %w", r.name, err, region.ErrNotLeader)
			w.send(m.from, m.to, rep)
		}
		return err
	}
	r.durable, r.dirty = p.live.Clone(), true
	for _, m := range replies {
		w.send(m.from, m.to, m.body)
	}
	return nil
}

// crash loses the leader process's memory; a new one leads from the durable image a little
// later.
func (r *regionNode) crash(w *world) {
	r.up, r.leader = false, nil
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
	case cartReq:
		return b.id
	case cartCloseReq:
		return b.id
	case coordReq:
		return b.id
	}
	panic(fmt.Sprintf("sim: request %T has no id", body))
}

// apply runs one request against a leader's memory. A coordinator request is checked
// against I4 here: the Core must refuse a generation below the highest it has admitted.
func (r *regionNode) apply(w *world, live *region.Core, body any) (any, error) {
	switch b := body.(type) {
	case reserveReq:
		r.holdSeq++
		return live.Reserve(w.now, b.req, fmt.Sprintf("%s-h%d", r.name, r.holdSeq))
	case confirmReq:
		before, _ := live.HoldByID(b.hold)
		res, err := live.Confirm(w.now, b.hold, b.payment)
		if err == nil && res.Sold && before.State == region.Held && !w.now.Before(before.ExpiresAt) {
			w.failf("I6", "confirm sold hold %s at %s, at or after its deadline %s", b.hold, w.now.Sub(epoch), before.ExpiresAt.Sub(epoch))
		}
		return res, err
	case releaseReq:
		return live.Release(w.now, b.hold)
	case cartReq:
		ids := make([]string, len(b.req.Lines))
		for i := range ids {
			r.holdSeq++
			ids[i] = fmt.Sprintf("%s-h%d", r.name, r.holdSeq)
		}
		return live.ReserveCart(w.now, b.req, ids)
	case cartCloseReq:
		if b.payment == "" {
			return live.ReleaseCart(w.now, b.cart)
		}
		return live.ConfirmCart(w.now, b.cart, b.payment)
	}
	call := body.(coordReq).call
	before := live.Fence(call.Transfer.Sale)
	res, err := participant(live, call)
	if err == nil && call.Generation < before {
		w.failf("I4", "region %s accepted a %s of generation %d after admitting %d", r.name, call.Kind, call.Generation, before)
	}
	return res, err
}

// participant runs a coordinator call against a leader's memory, as the region's participant
// service runs it against its writer.
func participant(live *region.Core, call coordinator.Call) (any, error) {
	t, gen := call.Transfer, call.Generation
	credit := region.CreditRequest{Generation: gen, TransferID: t.ID, Sale: t.Sale, SKU: t.SKU, Units: t.Units}
	debit := region.DebitRequest{Generation: gen, TransferID: t.ID, Sale: t.Sale, SKU: t.SKU, To: t.To, Units: t.Units}
	ref := region.TransferRef{Generation: gen, TransferID: t.ID, Sale: t.Sale}
	switch call.Kind {
	case coordinator.CallCredit:
		return live.Credit(credit)
	case coordinator.CallRefuse:
		return live.Refuse(credit)
	case coordinator.CallDebit:
		return live.Debit(debit)
	case coordinator.CallRefuseDebit:
		return live.RefuseDebit(debit)
	case coordinator.CallRestore:
		return live.Restore(ref)
	case coordinator.CallSettle:
		return live.Settle(ref)
	}
	panic(fmt.Sprintf("sim: coordinator call %q", call.Kind))
}
