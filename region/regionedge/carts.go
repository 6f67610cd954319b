package regionedge

import (
	"context"

	"github.com/quotaworks/quota/admission"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/region/regionrpc"
)

// Carts serves the storefront's cart routes at the edge (regionhttp.CartAPI): a cart's
// ticket is checked here as a single reserve's is, and every call is forwarded to the
// region's leader, which decides the cart whole (I10).
type Carts struct{ e *Edge }

// Carts is the edge's cart API.
func (e *Edge) Carts() Carts { return Carts{e: e} }

// Reserve checks the ticket's signature, then forwards the cart to the leader.
func (c Carts) Reserve(ctx context.Context, req region.CartRequest) (region.CartResult, error) {
	if err := region.CheckCart(req); err != nil { // as the leader would: an empty cart is no single reserve
		return region.CartResult{}, err
	}
	if err := c.e.verifyTicket(req.Ticket, req.Token); err != nil {
		return region.CartResult{}, err
	}
	lines := make([]*quotav1.CartLine, len(req.Lines))
	for i, l := range req.Lines {
		lines[i] = &quotav1.CartLine{Sku: l.SKU, Quantity: int64(l.Quantity)}
	}
	var out region.CartResult
	err := c.e.cfg.Upstream.call(ctx, func(ctx context.Context, rc quotav1.RegionServiceClient) error {
		res, err := rc.Reserve(ctx, &quotav1.ReserveRequest{SaleId: req.Sale, UserId: req.User, RequestKey: req.RequestKey,
			Lines: lines, Ticket: req.Ticket})
		if err != nil {
			return err
		}
		out.CartID, out.Replayed = res.GetCartId(), res.GetReplayed()
		out.Holds, err = holdsFromProtos(res.GetReservations())
		return err
	})
	return out, err
}

// Get forwards to the leader.
func (c Carts) Get(ctx context.Context, cartID string) (region.CartCloseResult, error) {
	out := region.CartCloseResult{CartID: cartID}
	err := c.e.cfg.Upstream.call(ctx, func(ctx context.Context, rc quotav1.RegionServiceClient) error {
		res, err := rc.GetReservation(ctx, &quotav1.GetReservationRequest{CartId: cartID})
		if err != nil {
			return err
		}
		out.Holds, err = holdsFromProtos(res.GetReservations())
		return err
	})
	return out, err
}

// Confirm forwards to the leader.
func (c Carts) Confirm(ctx context.Context, cartID, paymentID string) (region.CartCloseResult, error) {
	out := region.CartCloseResult{CartID: cartID}
	err := c.e.cfg.Upstream.call(ctx, func(ctx context.Context, rc quotav1.RegionServiceClient) error {
		res, err := rc.Confirm(ctx, &quotav1.ConfirmRequest{CartId: cartID, PaymentId: paymentID})
		if err != nil {
			return err
		}
		out.Sold, out.Reason = res.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD, res.GetReason()
		out.Holds, err = holdsFromProtos(res.GetReservations())
		return err
	})
	return out, err
}

// Release forwards to the leader.
func (c Carts) Release(ctx context.Context, cartID string) (region.CartCloseResult, error) {
	out := region.CartCloseResult{CartID: cartID}
	err := c.e.cfg.Upstream.call(ctx, func(ctx context.Context, rc quotav1.RegionServiceClient) error {
		res, err := rc.Release(ctx, &quotav1.ReleaseRequest{CartId: cartID})
		if err != nil {
			return err
		}
		out.Holds, err = holdsFromProtos(res.GetReservations())
		return err
	})
	return out, err
}

// verifyTicket checks a ticket's signature with the cluster's keys ("" : no ticket), so a
// forged or altered ticket never reaches the leader; tok is the ticket as its caller parsed
// it, or nil.
func (e *Edge) verifyTicket(ticket string, tok *admission.Token) error {
	if ticket == "" {
		return nil
	}
	if tok == nil {
		var err error
		if tok, err = admission.ParseToken(ticket); err != nil {
			return err
		}
	}
	_, err := e.cfg.Keys().VerifySignature(tok)
	return err
}

// holdsFromProtos is regionrpc.HoldFromProto of each.
func holdsFromProtos(pbs []*quotav1.Reservation) ([]region.Hold, error) {
	hs := make([]region.Hold, 0, len(pbs))
	for _, pb := range pbs {
		h, err := regionrpc.HoldFromProto(pb)
		if err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	return hs, nil
}
