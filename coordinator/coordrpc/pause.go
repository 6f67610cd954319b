package coordrpc

import (
	"context"

	"github.com/quotaworks/quota/coordinator"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// PauseToProto converts a ledger pause.
func PauseToProto(p coordinator.Pause) *quotav1.Pause {
	return &quotav1.Pause{SaleId: p.Sale, Sku: p.SKU, Paused: p.Paused, Reason: p.Reason, ChangedAt: timestamppb.New(p.ChangedAt),
		Version: int64(p.Version), Undelivered: p.Undelivered}
}

func failuresToProto(fs []coordinator.RegionFailure) []*quotav1.RegionFailure {
	out := make([]*quotav1.RegionFailure, 0, len(fs))
	for _, f := range fs {
		out = append(out, &quotav1.RegionFailure{Region: f.Region, Error: f.Error})
	}
	return out
}

// PauseSale implements CoordinatorService.
func (s *Server) PauseSale(ctx context.Context, req *quotav1.PauseSaleRequest) (_ *quotav1.PauseSaleResponse, err error) {
	defer func() { s.record(ctx, "pause", req.GetSaleId()+"/"+req.GetSku(), req, err) }()
	res, err := s.C.SetPaused(ctx, coordinator.PauseChange{Sale: req.GetSaleId(), SKU: req.GetSku(), Paused: true, Reason: req.GetReason()})
	if err != nil {
		return nil, err
	}
	return &quotav1.PauseSaleResponse{Sale: saleToProto(res.Sale), Reached: res.Reached, Unreached: failuresToProto(res.Unreached)}, nil
}

// ResumeSale implements CoordinatorService.
func (s *Server) ResumeSale(ctx context.Context, req *quotav1.ResumeSaleRequest) (_ *quotav1.ResumeSaleResponse, err error) {
	defer func() { s.record(ctx, "resume", req.GetSaleId()+"/"+req.GetSku(), req, err) }()
	res, err := s.C.SetPaused(ctx, coordinator.PauseChange{Sale: req.GetSaleId(), SKU: req.GetSku()})
	if err != nil {
		return nil, err
	}
	return &quotav1.ResumeSaleResponse{Sale: saleToProto(res.Sale), Reached: res.Reached, Unreached: failuresToProto(res.Unreached)}, nil
}
