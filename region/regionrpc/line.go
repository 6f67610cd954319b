package regionrpc

import (
	"context"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// LineChanges implements RegionService: the feed a storefront edge keeps its lines by.
func (s *Server) LineChanges(ctx context.Context, req *quotav1.LineChangesRequest) (*quotav1.LineChangesResponse, error) {
	d, err := s.door()
	if err != nil {
		return nil, err
	}
	f, err := d.LineChanges(ctx, req.GetSaleId(), req.GetRoom(), req.GetSince(), int(req.GetLimit()), req.GetTag(),
		time.Duration(req.GetWaitMs())*time.Millisecond)
	if err != nil {
		return nil, err
	}
	return LineFeedToProto(f), nil
}

// LineFeedToProto is a line's feed as the gRPC API answers it.
func LineFeedToProto(f region.LineFeed) *quotav1.LineChangesResponse {
	out := &quotav1.LineChangesResponse{Room: f.Room, Version: f.Version, Full: f.Full, More: f.More, Opened: f.Opened,
		Closed: f.Closed, Reason: f.Reason, OpensAt: timestamppb.New(f.OpensAt), Head: f.Head, Binding: int64(f.Binding),
		FlowRate: f.FlowRate, Gate: f.Gate, Region: f.Region, Tag: f.Tag, Entries: make([]*quotav1.LineEntry, len(f.Entries))}
	for i, e := range f.Entries {
		pe := &quotav1.LineEntry{AdmissionId: e.ID, UserId: e.User, State: string(e.State), Seq: e.Seq, Region: e.Region,
			Reason: e.Reason, Gone: e.Gone}
		if !e.ExpiresAt.IsZero() {
			pe.ExpiresAt = timestamppb.New(e.ExpiresAt)
		}
		out.Entries[i] = pe
	}
	return out
}

// feedStates are the entry states a line's feed may name.
var feedStates = map[string]admission.EntryState{}

func init() {
	for _, s := range []admission.EntryState{admission.Queued, admission.Binding, admission.Admitted, admission.Elsewhere,
		admission.Used, admission.Expired, admission.Closed} {
		feedStates[string(s)] = s
	}
}

// LineFeedFromProto reads a line's feed as a client (a storefront edge) gets it; an entry
// naming a state no line has, or a feed with no incarnation or a flow rate that is no
// positive number, is refused, naming the field.
func LineFeedFromProto(pb *quotav1.LineChangesResponse) (region.LineFeed, error) {
	if pb.GetRoom() == "" {
		return region.LineFeed{}, apierr.Invalid("room", "empty")
	}
	if !(pb.GetFlowRate() > 0) {
		return region.LineFeed{}, apierr.Invalid("flow_rate", "%v is not a positive number", pb.GetFlowRate())
	}
	f := region.LineFeed{Region: pb.GetRegion(), Gate: pb.GetGate(), Tag: pb.GetTag(), Feed: admission.Feed{Room: pb.GetRoom(), Version: pb.GetVersion(),
		Full: pb.GetFull(), More: pb.GetMore(), Opened: pb.GetOpened(), Closed: pb.GetClosed(), Reason: pb.GetReason(),
		OpensAt: pb.GetOpensAt().AsTime(), Head: pb.GetHead(), Binding: int(pb.GetBinding()), FlowRate: pb.GetFlowRate(),
		Entries: make([]admission.FeedEntry, len(pb.GetEntries()))}}
	for i, e := range pb.GetEntries() {
		st, ok := feedStates[e.GetState()]
		if !ok {
			return region.LineFeed{}, apierr.Invalid("entries.state", "%q names no state of a line (entry %s)", e.GetState(), e.GetAdmissionId())
		}
		fe := admission.FeedEntry{ID: e.GetAdmissionId(), User: e.GetUserId(), State: st, Seq: e.GetSeq(), Region: e.GetRegion(),
			Reason: e.GetReason(), Gone: e.GetGone()}
		if e.GetExpiresAt() != nil {
			fe.ExpiresAt = e.GetExpiresAt().AsTime()
		}
		f.Entries[i] = fe
	}
	return f, nil
}

// admissionStatesBack maps the proto's admission states back to the states a buyer is told.
var admissionStatesBack = map[quotav1.AdmissionState]admission.EntryState{}

func init() {
	for s, p := range admissionStates {
		admissionStatesBack[p] = s
	}
}

// AdmissionFromProto is an admission as a client of the gRPC API (a storefront edge) reads
// it back: AdmissionToProto's inverse for what a buyer is told (RetryAfter is recomputed from
// the estimate, as AdmissionToProto computed it).
func AdmissionFromProto(pb *quotav1.Admission) (region.Admission, error) {
	st, ok := admissionStatesBack[pb.GetState()]
	if !ok {
		return region.Admission{}, apierr.Invalid("admission.state", "%v names no state a buyer is told", pb.GetState())
	}
	a := region.Admission{Sale: pb.GetSaleId(), Ticket: pb.GetTicket(), SKU: pb.GetSku(), Entry: admission.Entry{ID: pb.GetAdmissionId(),
		User: pb.GetUserId(), State: st, Position: int(pb.GetPosition()), EstimatedWait: time.Duration(pb.GetEstimatedWaitMs()) * time.Millisecond,
		Region: pb.GetRegion(), Reason: pb.GetReason()}}
	if pb.GetExpiresAt() != nil {
		a.ExpiresAt = pb.GetExpiresAt().AsTime()
	}
	return a, nil
}

// HoldFromProto is a reservation as a client of the gRPC API reads it back (toProto's
// inverse).
func HoldFromProto(pb *quotav1.Reservation) (region.Hold, error) {
	st := HoldStateOf(pb.GetState())
	if st == "" {
		return region.Hold{}, apierr.Invalid("reservation.state", "%v names no hold state (hold %s)", pb.GetState(), pb.GetHoldId())
	}
	return region.Hold{ID: pb.GetHoldId(), Sale: pb.GetSaleId(), SKU: pb.GetSku(), User: pb.GetUserId(),
		Quantity: transfer.Units(pb.GetQuantity()), RequestKey: pb.GetRequestKey(), State: st,
		ExpiresAt: pb.GetExpiresAt().AsTime(), PaymentID: pb.GetPaymentId(), Region: pb.GetRegion(), Admission: pb.GetAdmissionId(),
		CartID: pb.GetCartId()}, nil
}

// SaleViewFromProto is a sale's view as a client of the gRPC API reads it back.
func SaleViewFromProto(pb *quotav1.DescribeSaleResponse) region.SaleView {
	v := region.SaleView{Region: pb.GetRegion(), ServerTime: pb.GetServerTime().AsTime(), Paused: pb.GetPaused(),
		Terms: region.SaleTerms{Sale: pb.GetSaleId(), PerUserLimit: transfer.Units(pb.GetPerUserLimit()),
			HoldTTL: time.Duration(pb.GetHoldTtlMs()) * time.Millisecond, OpensAt: pb.GetOpensAt().AsTime()}}
	v.Terms.Admission.Rate = pb.GetAdmitRate()
	v.Terms.Admission.TicketTTL = time.Duration(pb.GetTicketTtlMs()) * time.Millisecond
	v.Terms.Admission.ReturnURL = pb.GetRoomReturnUrl()
	for _, k := range pb.GetSkus() {
		v.SKUs = append(v.SKUs, region.SKUView{SKU: k.GetSku(), SoldOut: k.GetSoldOut(), Paused: k.GetPaused(), Available: transfer.Units(k.GetAvailable())})
	}
	return v
}
