package coordrpc

import (
	"context"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// defaultLatePayments is how many late payments per region a request without a limit lists.
const defaultLatePayments = 1000

// AuditLimits implements CoordinatorService.
func (s *Server) AuditLimits(ctx context.Context, req *quotav1.AuditLimitsRequest) (*quotav1.AuditLimitsResponse, error) {
	rep, err := s.C.Records().AuditLimits(ctx, req.GetSaleId())
	if err != nil {
		return nil, err
	}
	out := &quotav1.AuditLimitsResponse{Ok: rep.OK, At: timestamppb.New(rep.At), Sales: rep.Sales, Buyers: int64(rep.Buyers),
		Over: int64(rep.Over), Unreadable: failuresToProto(rep.Unreadable)}
	for _, o := range rep.Offenders {
		by := make(map[string]int64, len(o.ByRegion))
		for r, u := range o.ByRegion {
			by[r] = int64(u)
		}
		out.Offenders = append(out.Offenders, &quotav1.LimitOffender{SaleId: o.Sale, Sku: o.SKU, UserId: o.User, Limit: int64(o.Limit),
			Units: int64(o.Units), ByRegion: by, Bound: o.Bound, BoundError: o.BoundError})
	}
	return out, nil
}

// ListLatePayments implements CoordinatorService.
func (s *Server) ListLatePayments(ctx context.Context, req *quotav1.ListLatePaymentsRequest) (*quotav1.ListLatePaymentsResponse, error) {
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = defaultLatePayments
	}
	rep, err := s.C.Records().LatePayments(ctx, req.GetSaleId(), limit)
	if err != nil {
		return nil, err
	}
	out := &quotav1.ListLatePaymentsResponse{Truncated: rep.Truncated, Unreadable: failuresToProto(rep.Unreadable)}
	for _, l := range rep.Payments {
		out.Payments = append(out.Payments, latePaymentToProto(l))
	}
	return out, nil
}

func latePaymentToProto(l transfer.LatePayment) *quotav1.LatePayment {
	return &quotav1.LatePayment{Region: l.Region, HoldId: l.HoldID, PaymentId: l.PaymentID, HoldState: l.HoldState, Reason: l.Reason(),
		ReceivedAt: timestamppb.New(l.ReceivedAt), SaleId: l.Sale, Sku: l.SKU, UserId: l.User, Quantity: int64(l.Quantity),
		ExpiresAt: optionalTime(l.ExpiresAt), ClosedAt: optionalTime(l.ClosedAt)}
}

// optionalTime is t as a timestamp, nil when zero.
func optionalTime(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
