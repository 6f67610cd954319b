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

// bind decides where e's buyer is bound, records the outcome (line.go) and only then admits
// the buyer or ends the entry Elsewhere; a binding or a record that fails puts the buyer back
// first in line. A region that binds its buyers (Config.Binding) admits a buyer it does not
// know before the binding answers (bindLater): the binding is an etcd write that crosses the
// ocean when the regions are far apart, and it guards the sale (Confirm) rather than the
// ticket. Only a Door whose region does not bind (DoorConfig.Bind alone) waits for it here.
func (d *Door) bind(ctx context.Context, sr *saleRoom, e admission.Entry, wg *sync.WaitGroup) {
	room, sale := sr.room, sr.sale
	bound, later := d.r.cfg.Name, false
	switch {
	case d.r.binds != nil:
		var known bool
		if bound, known = d.r.binds.cached(saleUser{sale, e.User}); !known {
			bound, later = d.r.cfg.Name, true
		}
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
		return
	}
	if later {
		d.bindLater(ctx, sr, e, wg)
	}
}

// bindLater binds the buyer of e, an admission this region made before knowing the buyer's
// binding, in the background: bound here, the region remembers it (a confirm then needs no
// etcd); bound to another region, the admission is withdrawn (its entry ends Elsewhere, its
// ticket refused from then on: bindings.elsewhere) and the holds made on it are released
// (releaseBoundElsewhere). At most cap(d.later) run at once; beyond, and when the write
// fails, the buyer's first confirm binds them (confirmBound), so nothing is sold unbound.
func (d *Door) bindLater(ctx context.Context, sr *saleRoom, e admission.Entry, wg *sync.WaitGroup) {
	select {
	case d.later <- struct{}{}:
	default:
		d.cfg.Logger.Debug("binding after admission skipped: too many under way; the buyer's confirm binds", "sale", sr.sale, "user", e.User)
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { <-d.later }()
		k := saleUser{sr.sale, e.User}
		bound, err := d.r.binds.of(ctx, k)
		if err != nil {
			d.cfg.Logger.Warn("binding an admitted buyer failed; their confirm binds them", "sale", sr.sale, "user", e.User, "err", err)
			return
		}
		if bound != d.r.cfg.Name {
			d.withdraw(ctx, sr, e.ID, bound)
			releaseBoundElsewhere(ctx, d.r, k, bound)
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
