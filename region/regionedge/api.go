package regionedge

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/region/regionrpc"
	"github.com/quotaworks/quota/transfer"
)

// The edge serves the storefront routes (regionhttp.Serve) as both the region and its
// front door: these methods are regionhttp.RegionAPI's and regionhttp.DoorAPI's.

// changes fetches sale's line from the leader since (room, since), held up to wait while
// the leader's line is still the one tag names.
func (e *Edge) changes(ctx context.Context, sale, room string, since, tag uint64, wait time.Duration) (region.LineFeed, error) {
	var f region.LineFeed
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		res, err := c.LineChanges(ctx, &quotav1.LineChangesRequest{SaleId: sale, Room: room, Since: since, Limit: int32(e.cfg.FetchLimit),
			Tag: tag, WaitMs: uint32(wait.Milliseconds())})
		if err != nil {
			return err
		}
		f, err = regionrpc.LineFeedFromProto(res)
		return err
	})
	return f, err
}

// GetAdmission answers a poll from the sale's line as last fed, when it holds the admission
// and is fresh; else it asks the leader (and, once the leader answered, watches the sale).
func (e *Edge) GetAdmission(ctx context.Context, sale, id string) (region.Admission, error) {
	return e.poll(ctx, sale, id, false)
}

// PollAdmission is GetAdmission for the waiting-room page's public listener: what the edge's
// copy does not answer is asked of the leader's memory only (region.Door.PollAdmission), so
// a poll naming any sale id costs the region no query of its database.
func (e *Edge) PollAdmission(ctx context.Context, sale, id string) (region.Admission, error) {
	return e.poll(ctx, sale, id, true)
}

// poll is GetAdmission, forwarded as memoryOnly says.
func (e *Edge) poll(ctx context.Context, sale, id string, memoryOnly bool) (region.Admission, error) {
	if err := checkIDs("sale_id", sale, "admission_id", id); err != nil {
		return region.Admission{}, err
	}
	now := e.cfg.Now()
	if l := e.watching(sale); l != nil && e.fresh(l, now) {
		if en, ok := l.m.Get(id, now); ok {
			e.polls.Add(1)
			return e.answer(sale, l, en)
		}
	}
	e.forwarded.Add(1)
	var a region.Admission
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		res, err := c.GetAdmission(ctx, &quotav1.GetAdmissionRequest{SaleId: sale, AdmissionId: id, MemoryOnly: memoryOnly})
		if err != nil {
			return err
		}
		a, err = regionrpc.AdmissionFromProto(res.GetAdmission())
		return err
	})
	if err == nil {
		e.watch(sale)
	}
	return a, err
}

// Terms are sale's terms as the leader describes them, kept with the sale's line while the
// edge watches it (a sale's terms do not change). The waiting-room page asks them only for
// a signed entry link or an admitted buyer's return URL.
func (e *Edge) Terms(ctx context.Context, sale string) (region.SaleTerms, error) {
	if err := checkIDs("sale_id", sale); err != nil {
		return region.SaleTerms{}, err
	}
	l := e.watching(sale)
	if l != nil {
		l.mu.Lock()
		t := l.terms
		l.mu.Unlock()
		if t != nil {
			return *t, nil
		}
	}
	v, err := e.Describe(ctx, sale)
	if err != nil {
		return region.SaleTerms{}, err
	}
	if l != nil {
		l.mu.Lock()
		l.terms = &v.Terms
		l.mu.Unlock()
	}
	return v.Terms, nil
}

// answer is what the leader's door answers of entry en (region.Door's pollIn and answer):
// a line's closed gate for a buyer still waiting, BOUND_ELSEWHERE, or the admission with its
// ticket, signed here with the cluster's keys (a ticket is a pure function of the entry and
// the keys, so it is the one the leader signs).
func (e *Edge) answer(sale string, l *line, en admission.Entry) (region.Admission, error) {
	l.mu.Lock()
	gate, regionName := l.gate, l.region
	l.mu.Unlock()
	if gate != "" && !en.State.Final() && en.State != admission.Admitted {
		return region.Admission{}, region.ClosedError(sale, gate)
	}
	a := region.Admission{Entry: en, Sale: sale}
	switch en.State {
	case admission.Elsewhere:
		return a, &apierr.BoundError{Sale: sale, Region: en.Region}
	case admission.Admitted:
		tk, err := e.cfg.Keys().Sign(admission.Ticket{Sale: sale, User: en.User, Region: regionName, Admission: en.ID, Expires: en.ExpiresAt})
		if err != nil {
			return a, fmt.Errorf("sign the ticket of admission %s: %w", en.ID, err)
		}
		a.Ticket = tk
	}
	return a, nil
}

// Enter forwards a buyer's entry to the leader, but for a sale whose line is closed (sold
// out, paused) as last fed: a buyer with no place there is refused here, as the leader
// would.
func (e *Edge) Enter(ctx context.Context, sale, user, addr string) (region.Admission, error) {
	if err := checkIDs("sale_id", sale, "user_id", user); err != nil {
		return region.Admission{}, err
	}
	now := e.cfg.Now()
	if l := e.watching(sale); l != nil && e.fresh(l, now) {
		l.mu.Lock()
		gate := l.gate
		l.mu.Unlock()
		if en, ok := l.m.Lookup(user, now); gate != "" && (!ok || (!en.State.Final() && en.State != admission.Admitted)) {
			return region.Admission{}, region.ClosedError(sale, gate)
		}
	}
	a, err := e.admission(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) (*quotav1.Admission, error) {
		res, err := c.Enter(ctx, &quotav1.EnterRequest{SaleId: sale, UserId: user, ClientAddress: addr})
		return res.GetAdmission(), err
	})
	if err == nil {
		e.watch(sale) // the leader knows the sale: its line is worth a copy
	}
	return a, err
}

// JoinWaitlist forwards to the leader.
func (e *Edge) JoinWaitlist(ctx context.Context, sale, user, sku string) (region.Admission, error) {
	return e.admission(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) (*quotav1.Admission, error) {
		res, err := c.JoinWaitlist(ctx, &quotav1.JoinWaitlistRequest{SaleId: sale, UserId: user, Sku: sku})
		return res.GetAdmission(), err
	})
}

// admission calls the leader for an admission.
func (e *Edge) admission(ctx context.Context, fn func(context.Context, quotav1.RegionServiceClient) (*quotav1.Admission, error)) (region.Admission, error) {
	var a region.Admission
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		pb, err := fn(ctx, c)
		if err != nil {
			return err
		}
		a, err = regionrpc.AdmissionFromProto(pb)
		return err
	})
	return a, err
}

// Describe forwards to the leader (the HTTP routes keep each sale's page for a second).
func (e *Edge) Describe(ctx context.Context, sale string) (region.SaleView, error) {
	var v region.SaleView
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		res, err := c.DescribeSale(ctx, &quotav1.DescribeSaleRequest{SaleId: sale})
		if err != nil {
			return err
		}
		v = regionrpc.SaleViewFromProto(res)
		return nil
	})
	return v, err
}

// Reserve checks a ticket's signature here (a forged or altered ticket never reaches the
// leader), then forwards the reservation; the leader decides the rest of the ticket (its
// expiry, its sale, buyer and region, its one use).
func (e *Edge) Reserve(ctx context.Context, req region.ReserveRequest) (region.ReserveResult, error) {
	if err := e.verifyTicket(req.Ticket, req.Token); err != nil {
		return region.ReserveResult{}, err
	}
	var out region.ReserveResult
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		res, err := c.Reserve(ctx, &quotav1.ReserveRequest{SaleId: req.Sale, Sku: req.SKU, UserId: req.User,
			Quantity: int64(req.Quantity), RequestKey: req.RequestKey, Ticket: req.Ticket})
		if err != nil {
			return err
		}
		out.Replayed = res.GetReplayed()
		out.Hold, err = regionrpc.HoldFromProto(res.GetReservation())
		return err
	})
	return out, err
}

// GetReservation forwards to the leader.
func (e *Edge) GetReservation(ctx context.Context, holdID string) (region.Hold, error) {
	return e.hold(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) (*quotav1.Reservation, error) {
		res, err := c.GetReservation(ctx, &quotav1.GetReservationRequest{HoldId: holdID})
		return res.GetReservation(), err
	})
}

// Release forwards to the leader.
func (e *Edge) Release(ctx context.Context, holdID string) (region.Hold, error) {
	return e.hold(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) (*quotav1.Reservation, error) {
		res, err := c.Release(ctx, &quotav1.ReleaseRequest{HoldId: holdID})
		return res.GetReservation(), err
	})
}

func (e *Edge) hold(ctx context.Context, fn func(context.Context, quotav1.RegionServiceClient) (*quotav1.Reservation, error)) (region.Hold, error) {
	var h region.Hold
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		pb, err := fn(ctx, c)
		if err != nil {
			return err
		}
		h, err = regionrpc.HoldFromProto(pb)
		return err
	})
	return h, err
}

// Confirm forwards to the leader.
func (e *Edge) Confirm(ctx context.Context, holdID, paymentID string) (region.ConfirmResult, error) {
	var out region.ConfirmResult
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		res, err := c.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: holdID, PaymentId: paymentID})
		if err != nil {
			return err
		}
		out.Sold, out.Reason = res.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD, res.GetReason()
		out.Hold, err = regionrpc.HoldFromProto(res.GetReservation())
		return err
	})
	return out, err
}

// BuyerHolds forwards to the leader.
func (e *Edge) BuyerHolds(ctx context.Context, sale, user string, limit int) ([]region.Hold, bool, error) {
	var holds []region.Hold
	var truncated bool
	err := e.cfg.Upstream.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		res, err := c.ListBuyerHolds(ctx, &quotav1.ListBuyerHoldsRequest{SaleId: sale, UserId: user, Limit: int32(limit)})
		if err != nil {
			return err
		}
		truncated = res.GetTruncated()
		holds, err = holdsFromProtos(res.GetReservations())
		return err
	})
	return holds, truncated, err
}

// checkIDs refuses an id that is no id (transfer.CheckID), naming its field.
func checkIDs(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if why := transfer.CheckID(fields[i+1]); why != "" {
			return apierr.Invalid(fields[i], "%s", why)
		}
	}
	return nil
}
