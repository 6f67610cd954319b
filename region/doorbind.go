package region

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
)

// A Door's binding of the buyers it admits (the per-user limit across regions:
// docs/invariants.md, "The per-user limit").

// maxBindsLater bounds a Door's bindings after admission under way at once (bindLater).
const maxBindsLater = 1024

// bindTimeout bounds one binding write.
const bindTimeout = 2 * time.Second

// releaseAgainAfter is when a withdrawn admission's holds are read and released a second
// time (afterAdmission): longer than a writer's batch takes to commit.
const releaseAgainAfter = 2 * time.Second

// bindAnswer is a binding's outcome: the region recorded, or why there is none.
type bindAnswer struct {
	bound string
	err   error
}

// bind decides where e's buyer is bound, records the outcome (line.go) and only then admits
// the buyer or ends the entry Elsewhere; a binding or a record that fails puts the buyer back
// first in line. A region that binds its buyers (Config.Binding) waits for the binding of a
// buyer it does not know for DoorConfig.BindWait at most, then admits them and lets the
// binding finish in the background (bindLater): with the regions an ocean apart it is an etcd
// commit across the ocean, and it guards the sale (Confirm) rather than the ticket. A Door
// whose region does not bind (DoorConfig.Bind alone) waits for the binding.
func (d *Door) bind(ctx context.Context, sr *saleRoom, e admission.Entry, wg *sync.WaitGroup) {
	room, sale := sr.room, sr.sale
	bound := d.r.cfg.Name
	var later <-chan bindAnswer
	switch {
	case d.r.binds != nil:
		bound, later = d.bindOrWait(ctx, sr, e, wg)
	case d.cfg.Bind != nil:
		bctx, cancel := context.WithTimeout(ctx, bindTimeout)
		var err error
		bound, err = d.cfg.Bind(bctx, sale, e.User, d.r.cfg.Name)
		cancel()
		if err != nil {
			d.cfg.Logger.Warn("binding a buyer failed; the buyer stays first in line", "sale", sale, "user", e.User, "err", err)
			d.requeue(room, e.ID)
			return
		}
	}
	row := lineRow{sale: sale, id: e.ID, state: lineElsewhere, region: bound}
	settle := func(err error) {
		if err == nil {
			_, err = room.Elsewhere(e.ID, bound)
		}
		d.settled(room, e.ID, err)
	}
	if bound == d.r.cfg.Name {
		// The database keeps microseconds: the expiry a new leader reads is the one signed.
		expires := d.r.cfg.Clock.Now().Add(sr.ticketTTL).Truncate(time.Microsecond)
		row = lineRow{sale: sale, id: e.ID, state: lineAdmitted, expires: expires}
		settle = func(err error) {
			if err == nil {
				_, err = room.Admit(e.ID, expires)
			}
			d.settled(room, e.ID, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, lineWriteTimeout)
	defer cancel()
	if err := d.line.record(wctx, &lineReq{epoch: sr.epoch, row: row, settle: settle}); err != nil {
		d.cfg.Logger.Warn("recording an admission failed; the buyer stays first in line", "sale", sale, "user", e.User, "err", err)
	}
	if later != nil {
		d.afterAdmission(ctx, sr, e, later, wg) // the answer still comes, recorded or not
	}
}

// bindOrWait is where e's buyer is bound as far as the admission needs to know: from the
// region's memory; else the binding is started (bindLater) and waited for DoorConfig.BindWait
// at most. When it has not answered by then, or failed, the buyer is admitted here (bound is
// this region) and later, when not nil, brings the answer. No slot for a binding: the buyer
// is admitted, and their confirm binds them.
func (d *Door) bindOrWait(ctx context.Context, sr *saleRoom, e admission.Entry, wg *sync.WaitGroup) (bound string, later <-chan bindAnswer) {
	here := d.r.cfg.Name
	if v, ok := d.r.binds.cached(saleUser{sr.sale, e.User}); ok {
		return v, nil
	}
	ans := d.bindLater(ctx, sr.sale, e.User, wg)
	if ans == nil {
		return here, nil
	}
	t := time.NewTimer(d.cfg.BindWait)
	defer t.Stop()
	select {
	case a := <-ans:
		if a.err != nil {
			d.cfg.Logger.Warn("binding a buyer failed; admitted, their confirm binds them", "sale", sr.sale, "user", e.User, "err", a.err)
			return here, nil
		}
		return a.bound, nil
	case <-t.C:
		return here, ans
	case <-ctx.Done():
		return here, nil
	}
}

// bindLater binds (sale, user) in the background, in one of cap(d.later) slots, and answers
// on the channel it returns (buffered: the binding never waits for a reader); nil when every
// slot is taken. Bound here, the region remembers it, so a confirm needs no etcd.
func (d *Door) bindLater(ctx context.Context, sale, user string, wg *sync.WaitGroup) <-chan bindAnswer {
	select {
	case d.later <- struct{}{}:
	default:
		d.cfg.Logger.Debug("binding an admitted buyer skipped: too many under way; their confirm binds them", "sale", sale, "user", user)
		return nil
	}
	ans := make(chan bindAnswer, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { <-d.later }()
		bound, err := d.r.binds.of(ctx, saleUser{sale, user})
		ans <- bindAnswer{bound, err}
	}()
	return ans
}

// afterAdmission waits in the background for the binding of e's buyer, admitted here before
// it answered: bound to another region, the admission is withdrawn (its entry ends
// Elsewhere, its ticket refused from then on: bindings.elsewhere) and the holds made on it are
// released (releaseBoundElsewhere), read once when the binding answers and once more
// releaseAgainAfter later. A binding that fails is left to the buyer's first confirm
// (confirmBound), so nothing is sold unbound.
func (d *Door) afterAdmission(ctx context.Context, sr *saleRoom, e admission.Entry, later <-chan bindAnswer, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		var a bindAnswer
		select {
		case a = <-later:
		case <-ctx.Done():
			return
		}
		switch {
		case a.err != nil:
			d.cfg.Logger.Warn("binding an admitted buyer failed; their confirm binds them", "sale", sr.sale, "user", e.User, "err", a.err)
		case a.bound != d.r.cfg.Name:
			d.withdraw(ctx, sr, e.ID, a.bound)
			k := saleUser{sr.sale, e.User}
			releaseBoundElsewhere(ctx, d.r, k, a.bound)
			// A reservation that passed its check just before the binding answered may commit
			// after that read of the buyer's holds: it is released by a second one.
			select {
			case <-ctx.Done():
				return
			case <-time.After(releaseAgainAfter):
			}
			releaseBoundElsewhere(ctx, d.r, k, a.bound)
		}
	}()
}

// withdraw ends admission id Elsewhere, durable first (line.go), when it is still Admitted:
// its buyer's binding answered another region after the room admitted them here.
func (d *Door) withdraw(ctx context.Context, sr *saleRoom, id string, bound string) {
	if e, ok := sr.room.Get(id, d.r.cfg.Clock.Now()); !ok || e.State != admission.Admitted {
		return // used (its holds are released), expired or dropped: nothing to withdraw
	}
	settle := func(err error) {
		if err == nil {
			_, err = sr.room.Elsewhere(id, bound)
		}
		switch {
		case errors.Is(err, apierr.ErrConflict): // used meanwhile: its holds are released (bindLater)
			d.cfg.Logger.Debug("an admission used while being withdrawn", "sale", sr.sale, "admission", id, "err", err)
		case err != nil:
			d.cfg.Logger.Warn("withdrawing the admission of a buyer bound elsewhere", "sale", sr.sale, "admission", id, "err", err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, lineWriteTimeout)
	defer cancel()
	row := lineRow{sale: sr.sale, id: id, state: lineElsewhere, region: bound}
	if err := d.line.record(wctx, &lineReq{epoch: sr.epoch, row: row, settle: settle}); err != nil {
		d.cfg.Logger.Warn("recording the withdrawal of an admission failed; its ticket is refused here", "sale", sr.sale, "admission", id, "err", err)
	}
}
