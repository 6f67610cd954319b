package coordrpc

import (
	"context"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Transfer implements CoordinatorService.
func (s *Server) Transfer(ctx context.Context, req *quotav1.TransferRequest) (_ *quotav1.TransferResponse, err error) {
	defer func() { s.record(ctx, "transfer", req.GetSaleId()+"/"+req.GetSku(), req, err) }()
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
func (s *Server) ResolveTransfer(ctx context.Context, req *quotav1.ResolveTransferRequest) (_ *quotav1.ResolveTransferResponse, err error) {
	defer func() { s.record(ctx, "resolve transfer", req.GetTransferId(), req, err) }()
	t, err := s.C.Resolve(ctx, req.GetTransferId(), req.GetRefuse())
	if err != nil {
		return nil, err
	}
	return &quotav1.ResolveTransferResponse{Transfer: TransferToProto(t)}, nil
}

// Rebalance implements CoordinatorService.
func (s *Server) Rebalance(ctx context.Context, req *quotav1.RebalanceRequest) (_ *quotav1.RebalanceResponse, err error) {
	if !req.GetDryRun() { // a dry run changes nothing
		defer func() { s.record(ctx, "rebalance", req.GetSaleId()+"/"+req.GetSku(), req, err) }()
	}
	p, err := policyFromProto(req)
	if err != nil {
		return nil, err
	}
	res, err := s.C.Rebalance(ctx, coordinator.RebalanceRequest{Sale: req.GetSaleId(), SKU: req.GetSku(), Policy: p,
		DryRun: req.GetDryRun(), RequestID: req.GetRequestId()})
	if err != nil {
		return nil, err
	}
	return rebalanceToProto(res, p), nil
}

// policyFromProto is the policy a Rebalance request names; a window or horizon no duration
// holds is refused (policy), the rest the coordinator checks.
func policyFromProto(req *quotav1.RebalanceRequest) (transfer.Policy, error) {
	p := transfer.Policy{MinUnits: transfer.Units(req.GetMinUnits())}
	var err error
	if p.Window, err = apierr.Millis("policy", req.GetWindowMs()); err != nil {
		return p, err
	}
	p.Horizon, err = apierr.Millis("policy", req.GetHorizonMs())
	return p, err
}

// rebalanceToProto is a rebalance as RebalanceResponse answers it, each pool's need under p.
func rebalanceToProto(res coordinator.RebalanceResult, p transfer.Policy) *quotav1.RebalanceResponse {
	out := &quotav1.RebalanceResponse{Replayed: res.Replayed}
	for _, d := range res.Pools {
		out.Pools = append(out.Pools, &quotav1.PoolDemand{Pool: d.Pool, Available: int64(d.Available), Recent: int64(d.Recent), Need: int64(p.Need(d))})
	}
	out.Moves = movesToProto(res.Moves)
	for _, t := range res.Transfers {
		out.Transfers = append(out.Transfers, TransferToProto(t))
	}
	return out
}

func movesToProto(ms []transfer.Move) []*quotav1.PlannedMove {
	var out []*quotav1.PlannedMove
	for _, m := range ms {
		out = append(out, &quotav1.PlannedMove{From: m.From, To: m.To, Units: int64(m.Units)})
	}
	return out
}

// PlanRebalance implements CoordinatorService.
func (s *Server) PlanRebalance(ctx context.Context, req *quotav1.PlanRebalanceRequest) (*quotav1.PlanRebalanceResponse, error) {
	plan, err := s.C.PlanRebalance(ctx, req.GetSaleId())
	if err != nil {
		return nil, err
	}
	return planToProto(plan, s.C.AutoPolicy()), nil
}

// planToProto is the automatic rebalancer's plan under policy p as PlanRebalanceResponse
// answers it; a pool that never runs out has empty_in_ms -1.
func planToProto(plan coordinator.SalePlan, p transfer.Policy) *quotav1.PlanRebalanceResponse {
	out := &quotav1.PlanRebalanceResponse{SaleId: plan.Sale, Mode: string(plan.Mode), Enabled: plan.Enabled, At: timestamppb.New(plan.At),
		WindowMs: p.Window.Milliseconds(), HorizonMs: p.Horizon.Milliseconds(), MinUnits: int64(p.MinUnits)}
	for _, k := range plan.SKUs {
		sp := &quotav1.SkuPlan{Sku: k.SKU, NearSellOut: k.NearSellOut, InFlight: int64(k.InFlight), Held: k.Held, Moves: movesToProto(k.Moves)}
		for _, d := range k.Pools {
			empty := int64(-1)
			if d.Projection.EmptyIn >= 0 {
				empty = d.Projection.EmptyIn.Milliseconds()
			}
			sp.Pools = append(sp.Pools, &quotav1.PoolPlan{Pool: d.Pool, Available: int64(d.Available), Recent: int64(d.Recent),
				Incoming: int64(d.Incoming), Need: int64(d.Need), Frozen: d.Frozen, PerSecond: d.Projection.PerSecond, EmptyInMs: empty})
		}
		out.Skus = append(out.Skus, sp)
	}
	return out
}
