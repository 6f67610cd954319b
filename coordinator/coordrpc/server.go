// Package coordrpc is the gRPC adapter of the coordinator: CoordinatorService for operators
// and auditors, and the client side of ParticipantService the coordinator uses to reach
// regions. It only translates.
package coordrpc

import (
	"context"
	"log/slog"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Server serves a coordinator.
type Server struct {
	quotav1.UnimplementedCoordinatorServiceServer
	C *coordinator.Coordinator
	// Logger logs the action log's records and failures; default slog.Default().
	Logger *slog.Logger
	// Status gathers the cluster's status (GetStatus); nil answers that there is none.
	Status func(ctx context.Context) (coordinator.ClusterStatus, error)
}

func saleToProto(s coordinator.Sale) *quotav1.Sale {
	out := &quotav1.Sale{SaleId: s.Terms.Sale, PerUserLimit: int64(s.Terms.PerUserLimit),
		HoldTtlMs: s.Terms.HoldTTL.Milliseconds(), OpensAt: timestamppb.New(s.Terms.OpensAt), CreatedAt: timestamppb.New(s.CreatedAt),
		AdmitRate: s.Terms.Admission.Rate, TicketTtlMs: s.Terms.Admission.TicketTTL.Milliseconds(), MaxLiveTickets: s.Terms.Admission.MaxLive,
		Rebalance: string(s.Rebalance), RoomReturnUrl: s.Terms.Admission.ReturnURL}
	for _, k := range s.SKUs {
		alloc := map[string]int64{}
		for r, u := range k.Allocated {
			alloc[r] = int64(u)
		}
		out.Skus = append(out.Skus, &quotav1.SkuLedger{Sku: k.SKU, Total: int64(k.Total), Unallocated: int64(k.Unallocated), Allocated: alloc})
	}
	for _, p := range s.Pauses {
		out.Pauses = append(out.Pauses, PauseToProto(p))
	}
	return out
}

// CreateSale implements CoordinatorService.
func (s *Server) CreateSale(ctx context.Context, req *quotav1.CreateSaleRequest) (_ *quotav1.CreateSaleResponse, err error) {
	defer func() { s.record(ctx, "create sale", req.GetSaleId(), req, err) }()
	spec, err := saleSpecFromProto(req)
	if err != nil {
		return nil, err
	}
	sale, replayed, err := s.C.CreateSale(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &quotav1.CreateSaleResponse{Sale: saleToProto(sale), Replayed: replayed}, nil
}

// saleSpecFromProto is the sale a CreateSale request asks for. It refuses only what the
// coordinator could not be told (an invalid opens_at, a TTL no duration holds); the
// coordinator checks the rest.
func saleSpecFromProto(req *quotav1.CreateSaleRequest) (coordinator.SaleSpec, error) {
	spec := coordinator.SaleSpec{Sale: req.GetSaleId(), PerUserLimit: transfer.Units(req.GetPerUserLimit()),
		Admission: transfer.AdmissionTerms{Rate: req.GetAdmitRate(), MaxLive: req.GetMaxLiveTickets(), ReturnURL: req.GetRoomReturnUrl()},
		Rebalance: coordinator.RebalanceMode(req.GetRebalance())}
	var err error
	if spec.HoldTTL, err = apierr.Millis("hold_ttl", req.GetHoldTtlMs()); err != nil {
		return spec, err
	}
	if spec.Admission.TicketTTL, err = apierr.Millis("ticket_ttl", req.GetTicketTtlMs()); err != nil {
		return spec, err
	}
	if req.GetOpensAt() != nil {
		if err := req.GetOpensAt().CheckValid(); err != nil {
			return spec, apierr.Invalid("opens_at", "%v", err)
		}
		spec.OpensAt = req.GetOpensAt().AsTime()
	}
	for _, k := range req.GetSkus() {
		spec.SKUs = append(spec.SKUs, coordinator.SKUTotal{SKU: k.GetSku(), Total: transfer.Units(k.GetTotal())})
	}
	return spec, nil
}

// GetSale implements CoordinatorService.
func (s *Server) GetSale(ctx context.Context, req *quotav1.GetSaleRequest) (*quotav1.GetSaleResponse, error) {
	sale, err := s.C.GetSale(ctx, req.GetSaleId())
	if err != nil {
		return nil, err
	}
	return &quotav1.GetSaleResponse{Sale: saleToProto(sale)}, nil
}

// TransferToProto converts a ledger transfer.
func TransferToProto(t transfer.Transfer) *quotav1.TransferInfo {
	return &quotav1.TransferInfo{TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, From: t.From, To: t.To, Units: int64(t.Units),
		State: string(t.State), Generation: t.Generation, Stranded: t.Stranded, Reason: t.Reason, CreatedAt: timestamppb.New(t.CreatedAt)}
}

// Allocate implements CoordinatorService.
func (s *Server) Allocate(ctx context.Context, req *quotav1.AllocateRequest) (_ *quotav1.AllocateResponse, err error) {
	defer func() { s.record(ctx, "allocate", req.GetSaleId(), req, err) }()
	ar := coordinator.AllocateRequest{Sale: req.GetSaleId(), RequestID: req.GetRequestId()}
	for _, w := range req.GetWeights() {
		ar.Weights = append(ar.Weights, transfer.Weight{Region: w.GetRegion(), Weight: w.GetWeight()})
	}
	ts, replayed, err := s.C.Allocate(ctx, ar)
	if err != nil {
		return nil, err
	}
	out := &quotav1.AllocateResponse{Replayed: replayed}
	for _, t := range ts {
		out.Transfers = append(out.Transfers, TransferToProto(t))
	}
	return out, nil
}

// ListRegions implements CoordinatorService.
func (s *Server) ListRegions(ctx context.Context, _ *quotav1.ListRegionsRequest) (*quotav1.ListRegionsResponse, error) {
	gen, _ := s.C.Generation()
	out := &quotav1.ListRegionsResponse{Generation: gen}
	for _, r := range s.C.Regions() {
		out.Regions = append(out.Regions, &quotav1.RegionInfo{Name: r.Name, Address: r.CurrentAddress()})
	}
	return out, nil
}

// Audit implements CoordinatorService.
func (s *Server) Audit(ctx context.Context, req *quotav1.AuditRequest) (*quotav1.AuditResponse, error) {
	rep, err := s.C.Audit(ctx, req.GetSaleId())
	if err != nil {
		return nil, err
	}
	return auditToProto(rep), nil
}

// auditToProto is an audit report as AuditResponse answers it.
func auditToProto(rep coordinator.Report) *quotav1.AuditResponse {
	out := &quotav1.AuditResponse{Ok: rep.OK, At: timestamppb.New(rep.At)}
	for _, a := range rep.SKUs {
		out.Skus = append(out.Skus, skuAuditToProto(a))
	}
	for _, v := range rep.Violations {
		out.Violations = append(out.Violations, &quotav1.Violation{Invariant: v.Invariant, SaleId: v.Sale, Sku: v.SKU, Region: v.Region, Detail: v.Detail})
	}
	for _, p := range rep.Pauses {
		out.Pauses = append(out.Pauses, PauseToProto(p))
	}
	return out
}

// skuAuditToProto is one SKU's audit with its regions' pools.
func skuAuditToProto(a coordinator.SKUAudit) *quotav1.SkuAudit {
	sa := &quotav1.SkuAudit{SaleId: a.Sale, Sku: a.SKU, Total: int64(a.Total), Unallocated: int64(a.Unallocated),
		Available: int64(a.Available), Held: int64(a.Held), Sold: int64(a.Sold), InFlight: int64(a.InFlight),
		Stranded: int64(a.Stranded), Ok: a.OK}
	for _, r := range a.Regions {
		sa.Regions = append(sa.Regions, &quotav1.RegionAudit{Region: r.Region, Available: int64(r.Available), Held: int64(r.Held),
			Sold: int64(r.Sold), CreditedIn: int64(r.CreditedIn), DebitedOut: int64(r.DebitedOut), Reachable: r.Reachable, Error: r.Error})
	}
	return sa
}
