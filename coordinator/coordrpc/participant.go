package coordrpc

import (
	"context"
	"fmt"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Participant reaches one region's ParticipantService over gRPC.
type Participant struct {
	conn   *grpc.ClientConn
	client quotav1.ParticipantServiceClient
}

// DialParticipant connects (lazily) to a region at addr.
func DialParticipant(addr string) (*Participant, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("region %s: %w", addr, err)
	}
	return &Participant{conn: conn, client: quotav1.NewParticipantServiceClient(conn)}, nil
}

// Close closes the connection.
func (p *Participant) Close() error { return p.conn.Close() }

// PutSale implements coordinator.Participant.
func (p *Participant) PutSale(ctx context.Context, gen int64, t coordinator.SaleTerms) error {
	_, err := p.client.PutSale(ctx, &quotav1.PutSaleRequest{Generation: gen, Sale: &quotav1.SaleTerms{
		SaleId: t.Sale, Skus: t.SKUs, PerUserLimit: int64(t.PerUserLimit), HoldTtlMs: t.HoldTTL.Milliseconds(),
		OpensAt: timestamppb.New(t.OpensAt)}})
	return apierr.FromStatus(err)
}

// Credit implements coordinator.Participant.
func (p *Participant) Credit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error) {
	resp, err := p.client.Credit(ctx, &quotav1.CreditRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, Units: int64(t.Units)})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.InState(resp.GetState()), nil
}

// Refuse implements coordinator.Participant.
func (p *Participant) Refuse(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error) {
	resp, err := p.client.Refuse(ctx, &quotav1.RefuseRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, Units: int64(t.Units)})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.InState(resp.GetState()), nil
}

// Debit implements coordinator.Participant.
func (p *Participant) Debit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	resp, err := p.client.Debit(ctx, &quotav1.DebitRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, To: t.To, Units: int64(t.Units)})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.OutState(resp.GetState()), nil
}

// Restore implements coordinator.Participant.
func (p *Participant) Restore(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	resp, err := p.client.Restore(ctx, &quotav1.RestoreRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.OutState(resp.GetState()), nil
}

// Settle implements coordinator.Participant.
func (p *Participant) Settle(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	resp, err := p.client.Settle(ctx, &quotav1.SettleRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.OutState(resp.GetState()), nil
}

// Status implements coordinator.Participant.
func (p *Participant) Status(ctx context.Context, id string) (transfer.InState, transfer.OutState, error) {
	resp, err := p.client.TransferStatus(ctx, &quotav1.TransferStatusRequest{TransferId: id})
	if err != nil {
		return "", "", apierr.FromStatus(err)
	}
	return transfer.InState(resp.GetInbound()), transfer.OutState(resp.GetOutbound()), nil
}
