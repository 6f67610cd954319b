package coordrpc

import (
	"context"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// AuditHistory implements CoordinatorService.
func (s *Server) AuditHistory(ctx context.Context, req *quotav1.AuditHistoryRequest) (*quotav1.AuditHistoryResponse, error) {
	q := coordinator.AuditHistoryQuery{Sale: req.GetSaleId(), Before: req.GetBeforeRound(), Limit: int(req.GetLimit())}
	if req.GetSince() != nil {
		if err := req.GetSince().CheckValid(); err != nil {
			return nil, apierr.Invalid("since", "%v", err)
		}
		q.Since = req.GetSince().AsTime()
	}
	rounds, next, err := s.C.AuditHistory(ctx, q)
	if err != nil {
		return nil, err
	}
	out := &quotav1.AuditHistoryResponse{NextBeforeRound: next}
	for _, r := range rounds {
		out.Rounds = append(out.Rounds, roundToProto(r))
	}
	return out, nil
}

// roundToProto is a stored audit round as AuditHistoryResponse answers it.
func roundToProto(r coordinator.AuditRound) *quotav1.AuditRound {
	out := &quotav1.AuditRound{RoundId: r.ID, At: timestamppb.New(r.At), TookMs: r.Took.Milliseconds(), Ok: r.OK,
		Skus: int32(r.SKUs), Error: r.Error}
	for _, v := range r.Violations {
		out.Violations = append(out.Violations, &quotav1.Violation{Invariant: v.Invariant, SaleId: v.Sale, Sku: v.SKU, Region: v.Region, Detail: v.Detail})
	}
	for _, s := range r.Sales {
		rs := &quotav1.AuditRoundSale{SaleId: s.Sale, Ok: s.OK}
		for _, a := range s.SKUs {
			rs.Skus = append(rs.Skus, skuAuditToProto(a))
		}
		out.Sales = append(out.Sales, rs)
	}
	return out
}
