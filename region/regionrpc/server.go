// Package regionrpc is the gRPC adapter of a region: RegionService for storefronts and
// ParticipantService for the coordinator. It only translates; the region package decides.
package regionrpc

import (
	"context"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Server serves one region.
type Server struct {
	quotav1.UnimplementedRegionServiceServer
	quotav1.UnimplementedParticipantServiceServer
	R *region.Region
	// D is the region's front door (waiting rooms and tickets); nil: the storefront calls of
	// it answer CONFLICT, and Reserve goes to R directly.
	D *region.Door
}

// holdStates maps each hold state to the proto's; the names clients see are the states' own
// (region.HoldState.String), so this table only pairs them with the enum.
var holdStates = map[region.HoldState]quotav1.HoldState{
	region.Held: quotav1.HoldState_HOLD_STATE_HELD, region.Sold: quotav1.HoldState_HOLD_STATE_SOLD,
	region.Released: quotav1.HoldState_HOLD_STATE_RELEASED, region.Expired: quotav1.HoldState_HOLD_STATE_EXPIRED,
}

// HoldStateOf is the region's hold state a proto state stands for, read back from the one
// table that maps them; "" for UNSPECIFIED or a value it does not know. A client of the gRPC
// API (quotactl) names a state by it, as the HTTP edge does.
func HoldStateOf(pb quotav1.HoldState) region.HoldState {
	for s, p := range holdStates {
		if p == pb {
			return s
		}
	}
	return ""
}

func toProto(h region.Hold) *quotav1.Reservation {
	return &quotav1.Reservation{
		HoldId: h.ID, SaleId: h.Sale, Sku: h.SKU, UserId: h.User, Quantity: int64(h.Quantity),
		RequestKey: h.RequestKey, State: holdStates[h.State], ExpiresAt: timestamppb.New(h.ExpiresAt),
		PaymentId: h.PaymentID, Region: h.Region, AdmissionId: h.Admission, CartId: h.CartID,
	}
}

func toProtos(hs []region.Hold) []*quotav1.Reservation {
	out := make([]*quotav1.Reservation, len(hs))
	for i, h := range hs {
		out[i] = toProto(h)
	}
	return out
}

// Reserve implements RegionService: at the front door when the region has one (a ticket is
// verified there), else at the region.
func (s *Server) Reserve(ctx context.Context, req *quotav1.ReserveRequest) (*quotav1.ReserveResponse, error) {
	if len(req.GetLines()) > 0 {
		return s.reserveCart(ctx, req)
	}
	reserve := s.R.Reserve
	if s.D != nil {
		reserve = s.D.Reserve
	}
	res, err := reserve(ctx, region.ReserveRequest{
		Sale: req.GetSaleId(), SKU: req.GetSku(), User: req.GetUserId(),
		Quantity: transfer.Units(req.GetQuantity()), RequestKey: req.GetRequestKey(), Ticket: req.GetTicket(),
	})
	if err != nil {
		return nil, err
	}
	return &quotav1.ReserveResponse{Reservation: toProto(res.Hold), Replayed: res.Replayed}, nil
}

// reserveCart is Reserve of a request with lines: a cart.
func (s *Server) reserveCart(ctx context.Context, req *quotav1.ReserveRequest) (*quotav1.ReserveResponse, error) {
	if req.GetSku() != "" || req.GetQuantity() != 0 {
		return nil, apierr.Invalid("lines", "a cart's lines come in place of sku and quantity: send one or the other")
	}
	if n := len(req.GetLines()); n > region.MaxCartLines {
		return nil, apierr.Invalid("lines", "%d lines, more than the %d a cart may have", n, region.MaxCartLines)
	}
	lines := make([]region.CartLine, len(req.GetLines()))
	for i, l := range req.GetLines() {
		lines[i] = region.CartLine{SKU: l.GetSku(), Quantity: transfer.Units(l.GetQuantity())}
	}
	res, err := region.Carts{R: s.R, D: s.D}.Reserve(ctx, region.CartRequest{Sale: req.GetSaleId(), User: req.GetUserId(), RequestKey: req.GetRequestKey(),
		Ticket: req.GetTicket(), Lines: lines})
	if err != nil {
		return nil, err
	}
	return &quotav1.ReserveResponse{CartId: res.CartID, Reservations: toProtos(res.Holds), Replayed: res.Replayed}, nil
}

// cartOrHold is a confirm's or release's target: its cart id, "" for a hold (the one given).
func cartOrHold(hold, cart string) (string, error) {
	if hold != "" && cart != "" {
		return "", apierr.Invalid("cart_id", "give hold_id or cart_id, not both")
	}
	return cart, nil
}

// Confirm implements RegionService: of a hold, or of a cart (cart_id).
func (s *Server) Confirm(ctx context.Context, req *quotav1.ConfirmRequest) (*quotav1.ConfirmResponse, error) {
	cart, err := cartOrHold(req.GetHoldId(), req.GetCartId())
	if err != nil {
		return nil, err
	}
	if cart != "" {
		res, err := region.Carts{R: s.R}.Confirm(ctx, cart, req.GetPaymentId())
		if err != nil {
			return nil, err
		}
		return &quotav1.ConfirmResponse{Outcome: outcomeOf(res.Sold), Reservations: toProtos(res.Holds), Reason: res.Reason}, nil
	}
	res, err := s.R.Confirm(ctx, req.GetHoldId(), req.GetPaymentId())
	if err != nil {
		return nil, err
	}
	return &quotav1.ConfirmResponse{Outcome: outcomeOf(res.Sold), Reservation: toProto(res.Hold), Reason: res.Reason}, nil
}

func outcomeOf(sold bool) quotav1.ConfirmOutcome {
	if sold {
		return quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD
	}
	return quotav1.ConfirmOutcome_CONFIRM_OUTCOME_REFUND
}

// Release implements RegionService: of a hold, or of a cart (cart_id).
func (s *Server) Release(ctx context.Context, req *quotav1.ReleaseRequest) (*quotav1.ReleaseResponse, error) {
	cart, err := cartOrHold(req.GetHoldId(), req.GetCartId())
	if err != nil {
		return nil, err
	}
	if cart != "" {
		res, err := region.Carts{R: s.R}.Release(ctx, cart)
		if err != nil {
			return nil, err
		}
		return &quotav1.ReleaseResponse{Reservations: toProtos(res.Holds)}, nil
	}
	h, err := s.R.Release(ctx, req.GetHoldId())
	if err != nil {
		return nil, err
	}
	return &quotav1.ReleaseResponse{Reservation: toProto(h)}, nil
}

// ListBuyerHolds implements RegionService.
func (s *Server) ListBuyerHolds(ctx context.Context, req *quotav1.ListBuyerHoldsRequest) (*quotav1.ListBuyerHoldsResponse, error) {
	holds, truncated, err := s.R.BuyerHolds(ctx, req.GetSaleId(), req.GetUserId(), int(req.GetLimit()))
	if err != nil {
		return nil, err
	}
	return &quotav1.ListBuyerHoldsResponse{Reservations: toProtos(holds), Truncated: truncated}, nil
}

// GetReservation implements RegionService.
func (s *Server) GetReservation(ctx context.Context, req *quotav1.GetReservationRequest) (*quotav1.GetReservationResponse, error) {
	cart, err := cartOrHold(req.GetHoldId(), req.GetCartId())
	if err != nil {
		return nil, err
	}
	if cart != "" {
		res, err := region.Carts{R: s.R}.Get(ctx, cart)
		if err != nil {
			return nil, err
		}
		return &quotav1.GetReservationResponse{Reservations: toProtos(res.Holds)}, nil
	}
	h, err := s.R.GetReservation(ctx, req.GetHoldId())
	if err != nil {
		return nil, err
	}
	return &quotav1.GetReservationResponse{Reservation: toProto(h)}, nil
}

// GetStock implements RegionService.
func (s *Server) GetStock(ctx context.Context, req *quotav1.GetStockRequest) (*quotav1.GetStockResponse, error) {
	pools, err := s.R.Stock(ctx, req.GetSaleId())
	if err != nil {
		return nil, err
	}
	out := &quotav1.GetStockResponse{SaleId: req.GetSaleId()}
	for _, p := range pools {
		out.Pools = append(out.Pools, &quotav1.Pool{Region: s.R.Name(), Sku: p.SKU, Available: int64(p.Available),
			Held: int64(p.Held), Sold: int64(p.Sold), CreditedIn: int64(p.CreditedIn), DebitedOut: int64(p.DebitedOut)})
	}
	return out, nil
}

// PutSale implements ParticipantService.
func (s *Server) PutSale(ctx context.Context, req *quotav1.PutSaleRequest) (*quotav1.PutSaleResponse, error) {
	t, err := termsFromProto(req.GetSale())
	if err != nil {
		return nil, err
	}
	if err := s.R.PutSale(ctx, req.GetGeneration(), t); err != nil {
		return nil, err
	}
	return &quotav1.PutSaleResponse{}, nil
}

// termsFromProto is the sale's terms a PutSale request carries. It refuses only what the
// region could not be told (no terms, no valid opens_at, a TTL no duration holds); the
// region checks the rest.
func termsFromProto(t *quotav1.SaleTerms) (region.SaleTerms, error) {
	if t == nil {
		return region.SaleTerms{}, apierr.Invalid("sale", "missing")
	}
	if err := t.GetOpensAt().CheckValid(); err != nil { // a nil opens_at is invalid too
		return region.SaleTerms{}, apierr.Invalid("opens_at", "%v", err)
	}
	out := region.SaleTerms{Sale: t.GetSaleId(), SKUs: t.GetSkus(), PerUserLimit: transfer.Units(t.GetPerUserLimit()),
		OpensAt: t.GetOpensAt().AsTime(), Admission: transfer.AdmissionTerms{Rate: t.GetAdmitRate(), MaxLive: t.GetMaxLiveTickets(),
			ReturnURL: t.GetRoomReturnUrl()}}
	var err error
	if out.HoldTTL, err = apierr.Millis("hold_ttl", t.GetHoldTtlMs()); err != nil {
		return out, err
	}
	out.Admission.TicketTTL, err = apierr.Millis("ticket_ttl", t.GetTicketTtlMs())
	return out, err
}

// Credit implements ParticipantService.
func (s *Server) Credit(ctx context.Context, req *quotav1.CreditRequest) (*quotav1.CreditResponse, error) {
	st, err := s.R.Credit(ctx, region.CreditRequest{Generation: req.GetGeneration(), TransferID: req.GetTransferId(),
		Sale: req.GetSaleId(), SKU: req.GetSku(), Units: transfer.Units(req.GetUnits())})
	if err != nil {
		return nil, err
	}
	return &quotav1.CreditResponse{State: string(st)}, nil
}

// Debit implements ParticipantService.
func (s *Server) Debit(ctx context.Context, req *quotav1.DebitRequest) (*quotav1.DebitResponse, error) {
	st, err := s.R.Debit(ctx, region.DebitRequest{Generation: req.GetGeneration(), TransferID: req.GetTransferId(),
		Sale: req.GetSaleId(), SKU: req.GetSku(), To: req.GetTo(), Units: transfer.Units(req.GetUnits())})
	if err != nil {
		return nil, err
	}
	return &quotav1.DebitResponse{State: string(st)}, nil
}

// RefuseDebit implements ParticipantService.
func (s *Server) RefuseDebit(ctx context.Context, req *quotav1.RefuseDebitRequest) (*quotav1.RefuseDebitResponse, error) {
	st, err := s.R.RefuseDebit(ctx, region.DebitRequest{Generation: req.GetGeneration(), TransferID: req.GetTransferId(),
		Sale: req.GetSaleId(), SKU: req.GetSku(), To: req.GetTo(), Units: transfer.Units(req.GetUnits())})
	if err != nil {
		return nil, err
	}
	return &quotav1.RefuseDebitResponse{State: string(st)}, nil
}

// Refuse implements ParticipantService.
func (s *Server) Refuse(ctx context.Context, req *quotav1.RefuseRequest) (*quotav1.RefuseResponse, error) {
	st, err := s.R.Refuse(ctx, region.CreditRequest{Generation: req.GetGeneration(), TransferID: req.GetTransferId(),
		Sale: req.GetSaleId(), SKU: req.GetSku(), Units: transfer.Units(req.GetUnits())})
	if err != nil {
		return nil, err
	}
	return &quotav1.RefuseResponse{State: string(st)}, nil
}

// Restore implements ParticipantService.
func (s *Server) Restore(ctx context.Context, req *quotav1.RestoreRequest) (*quotav1.RestoreResponse, error) {
	st, err := s.R.Restore(ctx, region.TransferRef{Generation: req.GetGeneration(), TransferID: req.GetTransferId(), Sale: req.GetSaleId()})
	if err != nil {
		return nil, err
	}
	return &quotav1.RestoreResponse{State: string(st)}, nil
}

// Settle implements ParticipantService.
func (s *Server) Settle(ctx context.Context, req *quotav1.SettleRequest) (*quotav1.SettleResponse, error) {
	st, err := s.R.Settle(ctx, region.TransferRef{Generation: req.GetGeneration(), TransferID: req.GetTransferId(), Sale: req.GetSaleId()})
	if err != nil {
		return nil, err
	}
	return &quotav1.SettleResponse{State: string(st)}, nil
}

// TransferStatus implements ParticipantService.
func (s *Server) TransferStatus(ctx context.Context, req *quotav1.TransferStatusRequest) (*quotav1.TransferStatusResponse, error) {
	st, err := s.R.Status(ctx, req.GetTransferId())
	if err != nil {
		return nil, err
	}
	return &quotav1.TransferStatusResponse{Inbound: string(st.In), Outbound: string(st.Out)}, nil
}

// SetPaused implements ParticipantService.
func (s *Server) SetPaused(ctx context.Context, req *quotav1.SetPausedRequest) (*quotav1.SetPausedResponse, error) {
	rec, err := s.R.SetPaused(ctx, region.PauseRequest{Generation: req.GetGeneration(), Sale: req.GetSaleId(), SKU: req.GetSku(),
		Paused: req.GetPaused(), Reason: req.GetReason(), Version: region.PauseVersion(req.GetVersion())})
	if err != nil {
		return nil, err
	}
	return &quotav1.SetPausedResponse{Paused: rec.Paused, Version: int64(rec.Version)}, nil
}

// NodeStatus implements ParticipantService: any process of the region answers, leader or not.
func (s *Server) NodeStatus(_ context.Context, _ *quotav1.NodeStatusRequest) (*quotav1.NodeStatusResponse, error) {
	st := s.R.NodeStatus()
	out := &quotav1.NodeStatusResponse{Region: s.R.Name(), Leading: st.Leading, Epoch: st.Epoch,
		StandbyRefreshMs: st.Refresh.Milliseconds(), RefreshAgeMs: -1}
	if st.RefreshAge >= 0 {
		out.RefreshAgeMs = st.RefreshAge.Milliseconds()
	}
	return out, nil
}
