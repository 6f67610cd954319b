package coordrpc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Participant reaches one region's ParticipantService over gRPC: at the address its resolver
// names (the region's current leader, from etcd), or at its fixed address.
type Participant struct {
	region   string
	fallback string
	resolve  func() string
	creds    credentials.TransportCredentials
	mu       sync.Mutex
	conns    map[string]*grpc.ClientConn
	leader   string    // the leader's address as last resolved; "" to resolve again
	leaderAt time.Time // when leader was resolved
}

// leaderMaxAge is how long a participant calls the leader's address it resolved before it
// asks its resolver again, when no call has failed meanwhile: a call answered NOT_LEADER, or
// not at all, forgets the address at once (forgetLeader), so a region's failover is followed
// as soon as a call finds it, and the resolver (an etcd read, across an ocean from a distant
// region) is not asked before every call.
const leaderMaxAge = 30 * time.Second

// DialParticipant connects (lazily) to a region at addr, with creds (the coordinator role's
// client certificate, or insecure).
func DialParticipant(addr string, creds credentials.TransportCredentials) (*Participant, error) {
	return DialResolving("", addr, nil, creds)
}

// DialResolving connects (lazily) to wherever resolve names, or to fallback when it names
// nothing: after a region's leader changes, the coordinator follows it. Every call names
// region (rpcserve.RegionHeader, when not ""), so a server of another region refuses it.
func DialResolving(region, fallback string, resolve func() string, creds credentials.TransportCredentials) (*Participant, error) {
	if creds == nil {
		return nil, fmt.Errorf("region %s: no transport credentials (a certificate, or insecure)", fallback)
	}
	p := &Participant{region: region, fallback: fallback, resolve: resolve, creds: creds, conns: map[string]*grpc.ClientConn{}}
	if _, err := p.conn(fallback); err != nil {
		return nil, fmt.Errorf("region %s: %w", fallback, err)
	}
	return p, nil
}

func (p *Participant) conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(p.creds), grpc.WithConnectParams(rpcserve.PeerConnect),
		grpc.WithChainUnaryInterceptor(p.forgetLeader(addr))}
	if p.region != "" {
		opts = append(opts, grpc.WithChainUnaryInterceptor(rpcserve.WithRegion(p.region)))
	}
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	p.conns[addr] = c
	return c, nil
}

// target is the address to call: the leader as resolved within leaderMaxAge, else as the
// resolver names it now, else the fixed address.
func (p *Participant) target() string {
	if p.resolve == nil {
		return p.fallback
	}
	p.mu.Lock()
	if p.leader != "" && time.Since(p.leaderAt) < leaderMaxAge {
		defer p.mu.Unlock()
		return p.leader
	}
	p.mu.Unlock()
	a := p.resolve()
	if a == "" {
		return p.fallback
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leader, p.leaderAt = a, time.Now()
	return a
}

// forgetLeader is the interceptor of the connection to addr: a call there answered
// NOT_LEADER, or not at all (a transport failure), makes the participant resolve the leader
// again, and, when the resolver now names another address, asks that one once, as a call
// before the address was kept would have (every participant call is idempotent: a retry
// replays the region's record). A call that reached its deadline unanswered makes the next
// call resolve the leader again.
func (p *Participant) forgetLeader(addr string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if p.resolve == nil {
			return err
		}
		if status.Code(err) == codes.DeadlineExceeded {
			// No answer within the call's time: a leader that is frozen (stopped, its
			// connections open) answers nothing until the standby has long taken over. The
			// next call asks the resolver; this one's time is spent.
			p.forget(addr)
			return err
		}
		if !apierr.AskAnother(err) {
			return err
		}
		p.forget(addr)
		if ctx.Value(askedAgainKey{}) != nil {
			return err // already the second address asked: the caller retries later
		}
		next := p.target()
		if next == addr {
			return err
		}
		c, cerr := p.conn(next)
		if cerr != nil {
			return err
		}
		ctx = context.WithValue(ctx, askedAgainKey{}, true)
		rpcserve.RedialIfFailed(ctx, c)
		return c.Invoke(ctx, method, req, reply, opts...)
	}
}

// forget drops the leader's address kept, if it is still addr: the next call resolves it.
func (p *Participant) forget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.leader == addr {
		p.leader = ""
	}
}

// askedAgainKey marks the context of a call forgetLeader asks a second address.
type askedAgainKey struct{}

// client is the client of the leader's address (target), its connection told to dial at once
// if its last attempt failed: the leader as resolved is asked now, not after a backoff.
func (p *Participant) client(ctx context.Context) quotav1.ParticipantServiceClient {
	addr := p.target()
	c, err := p.conn(addr)
	if err != nil {
		c, _ = p.conn(p.fallback) // dialed when the participant was made
	}
	rpcserve.RedialIfFailed(ctx, c)
	return quotav1.NewParticipantServiceClient(c)
}

// Close closes every connection.
func (p *Participant) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for a, c := range p.conns {
		c.Close()
		delete(p.conns, a)
	}
	return nil
}

// PutSale implements coordinator.Participant.
func (p *Participant) PutSale(ctx context.Context, gen int64, t coordinator.SaleTerms) error {
	_, err := p.client(ctx).PutSale(ctx, &quotav1.PutSaleRequest{Generation: gen, Sale: termsToProto(t)})
	return apierr.FromStatus(err)
}

// termsToProto is a sale's terms as PutSale carries them.
func termsToProto(t coordinator.SaleTerms) *quotav1.SaleTerms {
	return &quotav1.SaleTerms{SaleId: t.Sale, Skus: t.SKUs, PerUserLimit: int64(t.PerUserLimit), HoldTtlMs: t.HoldTTL.Milliseconds(),
		OpensAt: timestamppb.New(t.OpensAt), AdmitRate: t.Admission.Rate, TicketTtlMs: t.Admission.TicketTTL.Milliseconds(),
		MaxLiveTickets: t.Admission.MaxLive, RoomReturnUrl: t.Admission.ReturnURL}
}

// Credit implements coordinator.Participant.
func (p *Participant) Credit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error) {
	resp, err := p.client(ctx).Credit(ctx, &quotav1.CreditRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, Units: int64(t.Units)})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.InState(resp.GetState()), nil
}

// Refuse implements coordinator.Participant.
func (p *Participant) Refuse(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error) {
	resp, err := p.client(ctx).Refuse(ctx, &quotav1.RefuseRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, Units: int64(t.Units)})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.InState(resp.GetState()), nil
}

// Debit implements coordinator.Participant.
func (p *Participant) Debit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	resp, err := p.client(ctx).Debit(ctx, &quotav1.DebitRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, To: t.To, Units: int64(t.Units)})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.OutState(resp.GetState()), nil
}

// RefuseDebit implements coordinator.Participant.
func (p *Participant) RefuseDebit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	resp, err := p.client(ctx).RefuseDebit(ctx, &quotav1.RefuseDebitRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale, Sku: t.SKU, To: t.To, Units: int64(t.Units)})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.OutState(resp.GetState()), nil
}

// Restore implements coordinator.Participant.
func (p *Participant) Restore(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	resp, err := p.client(ctx).Restore(ctx, &quotav1.RestoreRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.OutState(resp.GetState()), nil
}

// Settle implements coordinator.Participant.
func (p *Participant) Settle(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	resp, err := p.client(ctx).Settle(ctx, &quotav1.SettleRequest{Generation: gen, TransferId: t.ID, SaleId: t.Sale})
	if err != nil {
		return "", apierr.FromStatus(err)
	}
	return transfer.OutState(resp.GetState()), nil
}

// Status implements coordinator.Participant.
func (p *Participant) Status(ctx context.Context, id string) (transfer.InState, transfer.OutState, error) {
	resp, err := p.client(ctx).TransferStatus(ctx, &quotav1.TransferStatusRequest{TransferId: id})
	if err != nil {
		return "", "", apierr.FromStatus(err)
	}
	return transfer.InState(resp.GetInbound()), transfer.OutState(resp.GetOutbound()), nil
}

// SetPaused implements coordinator.Participant.
func (p *Participant) SetPaused(ctx context.Context, gen int64, ps coordinator.Pause) (bool, coordinator.PauseVersion, error) {
	resp, err := p.client(ctx).SetPaused(ctx, &quotav1.SetPausedRequest{Generation: gen, SaleId: ps.Sale, Sku: ps.SKU, Paused: ps.Paused,
		Reason: ps.Reason, Version: int64(ps.Version)})
	if err != nil {
		return false, 0, apierr.FromStatus(err)
	}
	return resp.GetPaused(), coordinator.PauseVersion(resp.GetVersion()), nil
}
