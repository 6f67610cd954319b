package region

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// saleWaitlist is one sold-out SKU's waitlist at this region.
type saleWaitlist struct {
	list  *admission.Waitlist
	pk    poolKey
	limit transfer.Units // the sale's per-user limit: the most one offer gives a buyer
	epoch int64          // the term it belongs to: its rows are written under it
}

// offers is the Door's waitlist half: the sold-out SKUs' waitlists (lists, guarded by the
// Door's mutex, since a new term replaces them together with the rooms: lineload.go), the
// offers of the units that come back to them, and the reservations those offers back.
type offers struct {
	d     *Door
	lists map[poolKey]*saleWaitlist
}

// JoinWaitlist puts user on a sold-out SKU's waitlist (the same place if they are on it):
// units that come back here (a release, an expiry) are set aside and offered to the line in
// order, each offer an admission with a ticket for that SKU, before any open buyer may take
// them. The buyer is bound to this region first, as an admission binds them (the per-user
// limit across regions). Refused: a SKU not sold out everywhere (CONFLICT: enter the
// waiting room instead), a buyer bound elsewhere (BOUND_ELSEWHERE).
func (d *Door) JoinWaitlist(ctx context.Context, sale, user, sku string) (Admission, error) {
	if err := checkIDs("sale_id", sale, "user_id", user, "sku", sku); err != nil {
		return Admission{}, err
	}
	now := d.r.cfg.Clock.Now()
	if err := d.gates.limit(user, "", now); err != nil {
		return Admission{}, err
	}
	_, t, err := d.room(ctx, sale)
	if err != nil {
		return Admission{}, err
	}
	if !t.HasSKU(sku) {
		return Admission{}, fmt.Errorf("sku %q is not in sale %s: %w", sku, sale, ErrNotFound)
	}
	d.mu.Lock()
	wl := d.offers.lists[poolKey{sale, sku}]
	d.mu.Unlock()
	// A waitlist with buyers or units set aside stays open: units it set aside count as
	// available, which can lower the drained flag while its buyers still wait.
	active := wl != nil && (wl.list.Len() > 0 || wl.list.SetAside() > 0)
	if !active && !d.gates.drained(sale, sku) {
		return Admission{}, fmt.Errorf("sku %s of sale %s is not sold out: enter the waiting room instead: %w", sku, sale, ErrConflict)
	}
	if err := d.offers.bindNow(ctx, sale, user); err != nil {
		return Admission{}, err
	}
	wl, err = d.offers.waitlist(t, sku)
	if err != nil {
		return Admission{}, err
	}
	e, a, err := wl.list.Arrive(user, now)
	if err != nil {
		return Admission{}, err
	}
	if a != nil { // a new place: taken once its row is committed
		e, err = d.recordArrival(ctx, wl.epoch, sale, sku, a, now, func(ok bool) admission.Entry {
			return wl.list.Settle(a, ok, d.r.cfg.Clock.Now())
		})
		if err != nil {
			return Admission{}, err
		}
	}
	d.r.aside.setWaiting(wl.pk, wl.list.Len())
	return d.offers.answerWaitlist(sale, sku, e)
}

// bindNow binds user to this region for sale, refusing a buyer bound elsewhere.
func (o *offers) bindNow(ctx context.Context, sale, user string) error {
	d := o.d
	if d.cfg.Bind == nil {
		return nil
	}
	bctx, cancel := context.WithTimeout(ctx, bindTimeout)
	defer cancel()
	bound, err := d.cfg.Bind(bctx, sale, user, d.r.cfg.Name)
	if err != nil {
		return fmt.Errorf("binding buyer %s to region %s: %v: %w", user, d.r.cfg.Name, err, apierr.ErrAborted)
	}
	if bound != d.r.cfg.Name {
		return &apierr.BoundError{Sale: sale, Region: bound}
	}
	return nil
}

// waitlist returns sku's waitlist in sale, made on first use.
func (o *offers) waitlist(t SaleTerms, sku string) (*saleWaitlist, error) {
	d := o.d
	pk := poolKey{t.Sale, sku}
	d.mu.Lock()
	defer d.mu.Unlock()
	if wl := o.lists[pk]; wl != nil {
		return wl, nil
	}
	wl, err := newSaleWaitlist(d.r.cfg.Name, t, sku, d.epoch)
	if err != nil {
		return nil, err
	}
	o.lists[pk] = wl
	return wl, nil
}

// newSaleWaitlist makes sku's waitlist in t's sale at region, for term epoch.
func newSaleWaitlist(region string, t SaleTerms, sku string, epoch int64) (*saleWaitlist, error) {
	list, err := admission.NewWaitlist(admission.WaitlistConfig{Sale: t.Sale, SKU: sku, Region: region})
	if err != nil {
		return nil, fmt.Errorf("sale %s sku %s: waitlist: %w", t.Sale, sku, err)
	}
	return &saleWaitlist{list: list, pk: poolKey{t.Sale, sku}, limit: t.PerUserLimit, epoch: epoch}, nil
}

// answerWaitlist is answer for a waitlist's entry: an offer's ticket is for its SKU only.
func (o *offers) answerWaitlist(sale, sku string, e admission.Entry) (Admission, error) {
	d := o.d
	a := Admission{Entry: e, Sale: sale, SKU: sku}
	if e.State == admission.Admitted {
		tk, err := d.cfg.Keys().Sign(admission.Ticket{Sale: sale, User: e.User, Region: d.r.cfg.Name, Admission: e.ID, SKU: sku,
			Expires: e.ExpiresAt})
		if err != nil {
			return a, fmt.Errorf("sign the ticket of waitlist offer %s: %w", e.ID, err)
		}
		a.Ticket = tk
	}
	return a, nil
}

// findOffer returns the waitlist entry id names in sale, if any.
func (o *offers) findOffer(sale, id string, now time.Time) (*saleWaitlist, admission.Entry, bool) {
	d := o.d
	d.mu.Lock()
	lists := make([]*saleWaitlist, 0, len(o.lists))
	for pk, wl := range o.lists {
		if pk.sale == sale {
			lists = append(lists, wl)
		}
	}
	d.mu.Unlock()
	for _, wl := range lists {
		if e, ok := wl.list.Get(id, now); ok {
			return wl, e, true
		}
	}
	return nil, admission.Entry{}, false
}

// offerReturned ends the offers that expired and offers the units set aside and not yet
// offered to the next buyers in line; with no one left in line they go back to every buyer.
func (o *offers) offerReturned(ctx context.Context, now time.Time) {
	d := o.d
	d.mu.Lock()
	lists := make([]*saleWaitlist, 0, len(o.lists))
	for _, wl := range o.lists {
		lists = append(lists, wl)
	}
	d.mu.Unlock()
	for _, wl := range lists {
		wl.list.Expire(now)
		unoffered := d.r.aside.of(wl.pk) - transfer.Units(wl.list.SetAside())
		switch {
		case unoffered > 0 && wl.list.Len() > 0:
			o.offer(ctx, wl, int(unoffered), now)
		case unoffered > 0:
			d.r.aside.add(wl.pk, -unoffered)
		}
		d.r.aside.setWaiting(wl.pk, wl.list.Len())
	}
}

// reserveOffer prepares a reservation made with a waitlist offer's ticket: while the offer is
// out, the reservation may take its units from those set aside. It returns the waitlist, or
// nil when the offer is not out here (claimed, expired, or lost with a failover).
func (o *offers) reserveOffer(req *ReserveRequest, tk admission.Ticket) *saleWaitlist {
	d := o.d
	wl, e, ok := o.findOffer(req.Sale, tk.Admission, d.r.cfg.Clock.Now())
	if !ok || e.State != admission.Admitted {
		return nil
	}
	req.fromAside = transfer.Units(e.Units)
	return wl
}

// offer makes the offers of units to wl's next buyers once their rows say so (line.go): a
// new leader finds them out, their units set aside. Each offer is made as its own record
// commits, whatever becomes of the others and even after this call gave up waiting (its
// settle); an offer not recorded is not made, and the next pass plans it again.
func (o *offers) offer(ctx context.Context, wl *saleWaitlist, units int, now time.Time) {
	d := o.d
	now = now.Truncate(time.Microsecond) // the expiry as stored is the one signed
	plan := wl.list.PlanOffers(units, int(wl.limit), now)
	wctx, cancel := context.WithTimeout(ctx, lineWriteTimeout)
	defer cancel()
	reqs := make([]*lineReq, len(plan))
	for i, o := range plan {
		reqs[i] = &lineReq{epoch: wl.epoch, row: lineRow{sale: wl.pk.sale, id: o.ID, state: lineAdmitted, expires: o.Expires,
			units: int64(o.Units)}, settle: func(err error) {
			if err == nil && !wl.list.OfferPlanned(o) {
				d.cfg.Logger.Warn("a recorded waitlist offer's buyer no longer waits", "sale", wl.pk.sale, "sku", wl.pk.sku, "offer", o.ID)
			}
		}}
	}
	if err := d.line.recordAll(wctx, reqs); err != nil {
		d.cfg.Logger.Warn("recording waitlist offers failed; those not recorded are tried again", "sale", wl.pk.sale, "sku", wl.pk.sku, "err", err)
	}
}
