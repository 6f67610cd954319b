package coordrpc

import (
	"context"
	"time"

	"github.com/quotaworks/quota/coordinator"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
)

// Transfer implements CoordinatorService.
func (s *Server) Transfer(ctx context.Context, req *quotav1.TransferRequest) (*quotav1.TransferResponse, error) {
	t, replayed, err := s.C.Transfer(ctx, coordinator.TransferRequest{Sale: req.GetSaleId(), SKU: req.GetSku(), From: req.GetFrom(),
		To: req.GetTo(), Units: transfer.Units(req.GetUnits()), RequestID: req.GetRequestId()})
	if err != nil {
		return nil, err
	}
	return &quotav1.TransferResponse{Transfer: TransferToProto(t), Replayed: replayed}, nil
}

// GetTransfer implements CoordinatorService.
func (s *Server) GetTransfer(ctx context.Context, req *quotav1.GetTransferRequest) (*quotav1.GetTransferResponse, error) {
	t, err := s.C.GetTransfer(ctx, req.GetTransferId())
	if err != nil {
		return nil, err
	}
	return &quotav1.GetTransferResponse{Transfer: TransferToProto(t)}, nil
}

// ListTransfers implements CoordinatorService.
func (s *Server) ListTransfers(ctx context.Context, req *quotav1.ListTransfersRequest) (*quotav1.ListTransfersResponse, error) {
	ts, err := s.C.Transfers(ctx, req.GetSaleId())
	if err != nil {
		return nil, err
	}
	out := &quotav1.ListTransfersResponse{}
	for _, t := range ts {
		if req.GetUnfinishedOnly() && t.State.Final() {
			continue
		}
		out.Transfers = append(out.Transfers, TransferToProto(t))
	}
	return out, nil
}

// ResolveTransfer implements CoordinatorService.
func (s *Server) ResolveTransfer(ctx context.Context, req *quotav1.ResolveTransferRequest) (*quotav1.ResolveTransferResponse, error) {
	t, err := s.C.Resolve(ctx, req.GetTransferId(), req.GetRefuse())
	if err != nil {
		return nil, err
	}
	return &quotav1.ResolveTransferResponse{Transfer: TransferToProto(t)}, nil
}

// Rebalance implements CoordinatorService.
func (s *Server) Rebalance(ctx context.Context, req *quotav1.RebalanceRequest) (*quotav1.RebalanceResponse, error) {
	p := transfer.Policy{Window: time.Duration(req.GetWindowMs()) * time.Millisecond,
		Horizon: time.Duration(req.GetHorizonMs()) * time.Millisecond, MinUnits: transfer.Units(req.GetMinUnits())}
	res, err := s.C.Rebalance(ctx, coordinator.RebalanceRequest{Sale: req.GetSaleId(), SKU: req.GetSku(), Policy: p,
		DryRun: req.GetDryRun(), RequestID: req.GetRequestId()})
	if err != nil {
		return nil, err
	}
	out := &quotav1.RebalanceResponse{Replayed: res.Replayed}
	for _, d := range res.Pools {
		out.Pools = append(out.Pools, &quotav1.PoolDemand{Pool: d.Pool, Available: int64(d.Available), Recent: int64(d.Recent), Need: int64(p.Need(d))})
	}
	for _, m := range res.Moves {
		out.Moves = append(out.Moves, &quotav1.PlannedMove{From: m.From, To: m.To, Units: int64(m.Units)})
	}
	for _, t := range res.Transfers {
		out.Transfers = append(out.Transfers, TransferToProto(t))
	}
	return out, nil
}
