package regionrpc

import (
	"context"

	"github.com/quotaworks/quota/admission"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// admissionStates maps the states a buyer is told (region.Admission.Shown) to the proto's.
var admissionStates = map[admission.EntryState]quotav1.AdmissionState{
	admission.Queued:   quotav1.AdmissionState_ADMISSION_STATE_QUEUED,
	admission.Admitted: quotav1.AdmissionState_ADMISSION_STATE_ADMITTED, admission.Used: quotav1.AdmissionState_ADMISSION_STATE_USED,
	admission.Expired: quotav1.AdmissionState_ADMISSION_STATE_EXPIRED, admission.Closed: quotav1.AdmissionState_ADMISSION_STATE_CLOSED,
}

// AdmissionToProto is an admission as the gRPC API answers it (the HTTP edge answers the same
// region.Admission as JSON).
func AdmissionToProto(a region.Admission) *quotav1.Admission {
	out := &quotav1.Admission{AdmissionId: a.ID, SaleId: a.Sale, UserId: a.User, State: admissionStates[a.Shown()],
		Position: int64(a.Position), EstimatedWaitMs: a.EstimatedWait.Milliseconds(), RetryAfterMs: a.RetryAfter().Milliseconds(),
		Ticket: a.Ticket, Region: a.Region, Reason: a.Reason, Sku: a.SKU}
	if !a.ExpiresAt.IsZero() {
		out.ExpiresAt = timestamppb.New(a.ExpiresAt)
	}
	return out
}

func (s *Server) door() (*region.Door, error) {
	if s.D == nil {
		return nil, region.ErrNoDoor
	}
	return s.D, nil
}

// Enter implements RegionService.
func (s *Server) Enter(ctx context.Context, req *quotav1.EnterRequest) (*quotav1.EnterResponse, error) {
	d, err := s.door()
	if err != nil {
		return nil, err
	}
	a, err := d.Enter(ctx, req.GetSaleId(), req.GetUserId(), req.GetClientAddress())
	if err != nil {
		return nil, err
	}
	return &quotav1.EnterResponse{Admission: AdmissionToProto(a)}, nil
}

// GetAdmission implements RegionService.
func (s *Server) GetAdmission(ctx context.Context, req *quotav1.GetAdmissionRequest) (*quotav1.GetAdmissionResponse, error) {
	d, err := s.door()
	if err != nil {
		return nil, err
	}
	poll := d.GetAdmission
	if req.GetMemoryOnly() {
		poll = d.PollAdmission
	}
	a, err := poll(ctx, req.GetSaleId(), req.GetAdmissionId())
	if err != nil {
		return nil, err
	}
	return &quotav1.GetAdmissionResponse{Admission: AdmissionToProto(a)}, nil
}

// DescribeSale implements RegionService.
func (s *Server) DescribeSale(ctx context.Context, req *quotav1.DescribeSaleRequest) (*quotav1.DescribeSaleResponse, error) {
	d, err := s.door()
	if err != nil {
		return nil, err
	}
	v, err := d.Describe(ctx, req.GetSaleId())
	if err != nil {
		return nil, err
	}
	t := v.Terms
	out := &quotav1.DescribeSaleResponse{SaleId: t.Sale, Region: v.Region, PerUserLimit: int64(t.PerUserLimit),
		HoldTtlMs: t.HoldTTL.Milliseconds(), OpensAt: timestamppb.New(t.OpensAt), ServerTime: timestamppb.New(v.ServerTime),
		Paused: v.Paused, AdmitRate: t.Admission.Rate, TicketTtlMs: t.Admission.TicketTTL.Milliseconds(),
		RoomReturnUrl: t.Admission.ReturnURL}
	for _, k := range v.SKUs {
		out.Skus = append(out.Skus, &quotav1.SkuView{Sku: k.SKU, SoldOut: k.SoldOut, Available: int64(k.Available), Paused: k.Paused})
	}
	return out, nil
}

// JoinWaitlist implements RegionService.
func (s *Server) JoinWaitlist(ctx context.Context, req *quotav1.JoinWaitlistRequest) (*quotav1.JoinWaitlistResponse, error) {
	d, err := s.door()
	if err != nil {
		return nil, err
	}
	a, err := d.JoinWaitlist(ctx, req.GetSaleId(), req.GetUserId(), req.GetSku())
	if err != nil {
		return nil, err
	}
	return &quotav1.JoinWaitlistResponse{Admission: AdmissionToProto(a)}, nil
}
