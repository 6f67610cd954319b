package sim

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/transfer"
)

// errCallTimeout is the answer a drive gets when a call's reply has not come within
// callTimeout (the production shell's CallTimeout).
var errCallTimeout = errors.New("sim: no answer within the call timeout")

// driving is one run of the production driver (a coordinator.Drive) over one transfer: a
// background round's, a Transfer's or a Resolve's. It waits for at most one reply.
type driving struct {
	d          *coordinator.Drive
	transfer   string
	background bool
	stranded   bool      // the transfer was flagged stranded when the drive began
	req        int       // the request whose reply it waits for (0: none)
	sentAt     time.Time // when that request was sent
}

// coordNode is one coordinator process. It leads with generation gen (0: it does not); after
// losing its lease it may go on as a zombie until zombieUntil, its requests and ledger
// writes carrying the old generation: the regions' and the ledger's fences must make them
// change nothing (I4). Its drives are the production driver's, their calls carried by the
// simulated network, their ledger writes made through nodeLedger.
type coordNode struct {
	name        string
	gen         int64
	zombieUntil time.Time
	drives      []*driving
	waiting     map[int]*driving
	round       map[string]time.Time // transfer → when its last background drive ended
	background  map[string]int       // transfer → its background drives among drives
}

func newCoordNode(name string) *coordNode {
	return &coordNode{name: name, background: map[string]int{}}
}

// lead makes the node leader with generation gen and a fresh memory.
func (c *coordNode) lead(gen int64) {
	c.gen, c.zombieUntil = gen, time.Time{}
	c.drives, c.waiting, c.round, c.background = nil, map[int]*driving{}, map[string]time.Time{}, map[string]int{}
}

// depose ends the node's leadership: at once (crashed), or after zombie time (paused past
// its lease, it does not know yet).
func (c *coordNode) depose(now time.Time, zombie time.Duration) {
	if zombie <= 0 {
		c.stop()
		return
	}
	c.zombieUntil = now.Add(zombie)
}

// stop ends the process's leadership and every drive of it (StepDown).
func (c *coordNode) stop() {
	c.gen, c.drives, c.waiting, c.background = 0, nil, map[int]*driving{}, map[string]int{}
}

func (c *coordNode) leading(w *world) bool {
	if c.gen == 0 {
		return false
	}
	if !c.zombieUntil.IsZero() && !w.now.Before(c.zombieUntil) {
		c.stop()
		return false
	}
	return true
}

// simClock is the simulated clock as the driver reads it.
type simClock struct{ w *world }

func (s simClock) Now() time.Time { return s.w.now }

func (c *coordNode) driveConfig(w *world) coordinator.DriveConfig {
	return coordinator.DriveConfig{Ledger: nodeLedger{w, c}, Clock: simClock{w}, StrandAfter: strandAfter,
		Logger: slog.New(slog.DiscardHandler)}
}

// turn times out the calls whose answer is overdue (as CallTimeout does), then, as the
// production driveLoop does every RetryInterval, drives every unfinished transfer that has
// no background drive and whose last one ended retryEvery ago.
func (c *coordNode) turn(w *world) {
	if !c.leading(w) {
		return
	}
	for _, dr := range slices.Clone(c.drives) {
		if dr.req != 0 && w.now.Sub(dr.sentAt) >= callTimeout {
			delete(c.waiting, dr.req)
			dr.req = 0
			c.feed(w, dr, coordinator.Reply{Err: errCallTimeout})
		}
	}
	for _, t := range w.ledger.unfinished() {
		if at, ok := c.round[t.ID]; (ok && w.now.Sub(at) < retryEvery) || c.driving(t.ID) {
			continue
		}
		c.start(w, t, false, true)
	}
}

// driving reports whether a background drive of transfer id is under way.
func (c *coordNode) driving(id string) bool { return c.background[id] > 0 }

// start drives transfer t (refuse: as Resolve --refuse does).
func (c *coordNode) start(w *world, t transfer.Transfer, refuse, background bool) {
	dr := &driving{d: coordinator.NewDrive(c.driveConfig(w), c.gen, t, refuse), transfer: t.ID,
		background: background, stranded: t.Stranded}
	c.drives = append(c.drives, dr)
	if background {
		c.background[t.ID]++
	}
	call, ok := dr.d.Start(context.Background())
	c.next(w, dr, call, ok)
}

// next sends the drive's call, or retires the drive once it has ended.
func (c *coordNode) next(w *world, dr *driving, call coordinator.Call, ok bool) {
	if ok {
		id := w.nextID()
		dr.req, dr.sentAt = id, w.now
		c.waiting[id] = dr
		w.send(c.name, call.Region, coordReq{id, call})
		return
	}
	c.drives = slices.DeleteFunc(c.drives, func(o *driving) bool { return o == dr })
	if dr.background {
		c.round[dr.transfer] = w.now
		if c.background[dr.transfer]--; c.background[dr.transfer] <= 0 {
			delete(c.background, dr.transfer)
		}
	}
	t, err := dr.d.Result()
	if t.Stranded && !dr.stranded {
		w.stats.Ops["transfer stranded"]++
	}
	switch {
	case errors.Is(err, coordinator.ErrFenced): // a deposed coordinator's write: I4 at work
		w.stats.Ops["coordinator write fenced"]++
	case err != nil: // the simulated ledger fails no write but by its fence
		w.failf("driver", "coordinator %s: transfer %s: %v", c.name, dr.transfer, err)
	}
}

// receive hands a region's reply to the drive that waits for it.
func (c *coordNode) receive(w *world, m message) {
	rep, ok := m.body.(reply)
	if !ok {
		return
	}
	dr, ok := c.waiting[rep.id]
	delete(c.waiting, rep.id)
	if !ok || !c.leading(w) {
		return
	}
	dr.req = 0
	r := coordinator.Reply{Err: rep.err}
	switch res := rep.res.(type) {
	case transfer.OutState:
		r.Out = res
	case transfer.InState:
		r.In = res
	}
	if rep.err != nil {
		w.stats.Ops["coordinator step refused"]++
	}
	c.feed(w, dr, r)
}

func (c *coordNode) feed(w *world, dr *driving, r coordinator.Reply) {
	call, ok := dr.d.Reply(context.Background(), r)
	c.next(w, dr, call, ok)
}
