package regionedge

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// leaderBoard is which of the test's region processes leads.
type leaderBoard struct {
	mu     sync.Mutex
	leader string
}

func (b *leaderBoard) get() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.leader
}

func (b *leaderBoard) set(addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.leader = addr
}

// boardRegion is a region process over gRPC on loopback as the upstream sees one: the
// leader (the board's) answers DescribeSale with its own address; every other process
// answers NOT_LEADER naming the leader. GetReservation at the leader waits for hold (closed)
// once it has said so on started.
type boardRegion struct {
	quotav1.UnimplementedRegionServiceServer
	addr    string
	board   *leaderBoard
	started chan struct{}
	hold    chan struct{}
	srv     *grpc.Server
}

func (s *boardRegion) leading() error {
	if l := s.board.get(); l != s.addr {
		return apierr.ToStatus(&apierr.NotLeaderError{Role: "region us", Leader: l})
	}
	return nil
}

func (s *boardRegion) DescribeSale(_ context.Context, req *quotav1.DescribeSaleRequest) (*quotav1.DescribeSaleResponse, error) {
	if err := s.leading(); err != nil {
		return nil, err
	}
	return &quotav1.DescribeSaleResponse{SaleId: req.GetSaleId(), Region: s.addr}, nil
}

func (s *boardRegion) GetReservation(ctx context.Context, _ *quotav1.GetReservationRequest) (*quotav1.GetReservationResponse, error) {
	if err := s.leading(); err != nil {
		return nil, err
	}
	s.started <- struct{}{}
	select {
	case <-s.hold:
		return &quotav1.GetReservationResponse{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// frozenRegion is a region process that is stopped (SIGSTOP) as a caller sees one: its
// connections stay open and it answers nothing, not even NOT_LEADER.
type frozenRegion struct {
	quotav1.UnimplementedRegionServiceServer
}

func (frozenRegion) DescribeSale(ctx context.Context, _ *quotav1.DescribeSaleRequest) (*quotav1.DescribeSaleResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// frozenHealth is the health service of a stopped process: it answers no check.
type frozenHealth struct {
	healthpb.UnimplementedHealthServer
}

func (frozenHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestUpstreamMovesOnFromAFrozenLeader: the leader an upstream calls freezes (answers
// nothing, not even a health check, its connection open) and the standby takes over 600 ms
// later. A call made at the freeze is answered by the standby once it leads, within the
// caller's 10 s: each attempt at the frozen process ends when its liveness check goes
// unanswered, and moves on. Without that check the call waits on the frozen leader until its
// caller gives up.
func TestUpstreamMovesOnFromAFrozenLeader(t *testing.T) {
	b := &leaderBoard{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	frozen := grpc.NewServer()
	quotav1.RegisterRegionServiceServer(frozen, frozenRegion{})
	healthpb.RegisterHealthServer(frozen, frozenHealth{})
	go func() { _ = frozen.Serve(ln) }() // Serve returns once Stop is called
	defer frozen.Stop()
	standby := startBoardRegion(t, b)
	b.set(ln.Addr().String()) // the standby names the frozen process until it takes over
	u := testUpstream(t, ln.Addr().String(), standby.addr)
	u.check, u.probe = 100*time.Millisecond, 200*time.Millisecond
	time.AfterFunc(600*time.Millisecond, func() { b.set(standby.addr) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	at, err := describe(ctx, u)
	if err != nil || at != standby.addr {
		t.Fatalf("the call was answered by %q (%v) after %s; want the standby %s", at, err, time.Since(start).Round(time.Millisecond), standby.addr)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the standby answered %s after the freeze; want within 3 s (it led after 600 ms)", took.Round(time.Millisecond))
	}
	if u.Leader() != standby.addr {
		t.Errorf("the upstream calls %s next; want the standby %s", u.Leader(), standby.addr)
	}
}

// startBoardRegion serves a boardRegion on a new loopback port.
func startBoardRegion(t *testing.T, b *leaderBoard) *boardRegion {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &boardRegion{addr: ln.Addr().String(), board: b, started: make(chan struct{}, 1), hold: make(chan struct{}), srv: grpc.NewServer()}
	quotav1.RegisterRegionServiceServer(s.srv, s)
	go func() { _ = s.srv.Serve(ln) }() // Serve returns once Stop is called
	t.Cleanup(s.srv.Stop)
	return s
}

// testUpstream is an upstream of region us with seeds (plaintext), closed at the test's end.
func testUpstream(t *testing.T, seeds ...string) *Upstream {
	t.Helper()
	u, err := NewUpstream("us", seeds, insecure.NewCredentials())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Close)
	return u
}

// getReservation calls GetReservation through u: a boardRegion leader holds it until hold.
func getReservation(ctx context.Context, u *Upstream) error {
	return u.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		_, err := c.GetReservation(ctx, &quotav1.GetReservationRequest{HoldId: "h"})
		return err
	})
}

// describe calls DescribeSale through u and returns the address that answered.
func describe(ctx context.Context, u *Upstream) (string, error) {
	var at string
	err := u.call(ctx, func(ctx context.Context, c quotav1.RegionServiceClient) error {
		res, err := c.DescribeSale(ctx, &quotav1.DescribeSaleRequest{SaleId: "s"})
		at = res.GetRegion()
		return err
	})
	return at, err
}

// TestUpstreamEvictsOldLeaders: the region's leader moves to a new port 40 times (each old
// leader stopped, as a restarted process's port is gone), more addresses than an upstream
// keeps connections to. After each move a call reaches the new leader, the connections kept
// never pass maxConns, and a call in flight on the first leader's connection all along (the
// least recently used one) is not cut: it ends with its answer. Meanwhile four callers call
// over and over: none of their calls is cut or refused either (they may give up as
// NOT_LEADER, the leader moving faster than their few tries).
func TestUpstreamEvictsOldLeaders(t *testing.T) {
	const moves = 40
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &leaderBoard{}
	seed := startBoardRegion(t, b)
	first := startBoardRegion(t, b)
	b.set(first.addr)
	u := testUpstream(t, seed.addr)
	inFlight := make(chan error, 1)
	go func() {
		inFlight <- getReservation(ctx, u)
	}()
	<-first.started
	stop := describeMeanwhile(ctx, u, 4)
	prev := first
	for i := range moves {
		next := startBoardRegion(t, b)
		b.set(next.addr)
		if prev != first {
			prev.srv.Stop()
		}
		at, err := describe(ctx, u)
		if err != nil || at != next.addr {
			t.Fatalf("leader %d of %d at %s: the call answered %q, %v", i+1, moves, next.addr, at, err)
		}
		u.mu.Lock()
		n := len(u.conns)
		u.mu.Unlock()
		if n > maxConns {
			t.Fatalf("leader %d: %d connections kept, over %d", i+1, n, maxConns)
		}
		prev = next
	}
	for _, err := range stop() {
		t.Errorf("a concurrent caller: %v", err)
	}
	close(first.hold)
	if err := <-inFlight; err != nil {
		t.Errorf("the call in flight on the first leader's connection: %v", err)
	}
}

// describeMeanwhile has n callers call describe through u over and over until the function
// it returns is called, which answers the first error of each caller that had one. A call
// may give up as NOT_LEADER (its few tries all found leaders already moved on, with the
// leader moving every few tens of milliseconds here); any other error (a connection closed
// under the call, OVERLOADED) counts.
func describeMeanwhile(ctx context.Context, u *Upstream, n int) func() []error {
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := describe(ctx, u); err != nil && !errors.Is(err, apierr.ErrNotLeader) {
					errs <- err
					return
				}
			}
		}()
	}
	return func() []error {
		close(done)
		wg.Wait()
		close(errs)
		var out []error
		for err := range errs {
			out = append(out, err)
		}
		return out
	}
}

// TestUpstreamRedialsALeaderBackOnItsPort: the leader is killed and comes back on the same
// port (a restarted process), after the upstream's connection to it has failed several
// times. The first call after it is back reaches it, instead of failing on a connection that
// waits out its backoff.
func TestUpstreamRedialsALeaderBackOnItsPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &leaderBoard{}
	seed := startBoardRegion(t, b)
	leader := startBoardRegion(t, b)
	b.set(leader.addr)
	u := testUpstream(t, seed.addr)
	if at, err := describe(ctx, u); err != nil || at != leader.addr {
		t.Fatalf("before the kill: answered %q, %v", at, err)
	}
	leader.srv.Stop()
	for i := range 3 { // the seed keeps naming the dead leader: every call fails
		if _, err := describe(ctx, u); err == nil {
			t.Fatalf("call %d with the leader down answered", i+1)
		}
	}
	back := restartBoardRegion(t, b, leader.addr)
	start := time.Now()
	at, err := describe(ctx, u)
	if err != nil || at != back.addr {
		t.Fatalf("the leader back on %s: the first call answered %q, %v (after %v)", back.addr, at, err, time.Since(start))
	}
}

// restartBoardRegion serves a boardRegion again at addr, a port a stopped one had.
func restartBoardRegion(t *testing.T, b *leaderBoard, addr string) *boardRegion {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the stopped server's socket may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &boardRegion{addr: addr, board: b, started: make(chan struct{}, 1), hold: make(chan struct{}), srv: grpc.NewServer()}
	quotav1.RegisterRegionServiceServer(s.srv, s)
	go func() { _ = s.srv.Serve(ln) }() // Serve returns once Stop is called
	t.Cleanup(s.srv.Stop)
	return s
}

// TestUpstreamWaitsForASlowLeader: a leader that takes 1.5 s to answer (a binding waiting on
// a slow etcd, say) but answers its health checks is waited for: the call gets its answer,
// from the leader, and the upstream still calls the leader next. Its liveness check ran many
// times meanwhile (every 100 ms here).
func TestUpstreamWaitsForASlowLeader(t *testing.T) {
	b := &leaderBoard{}
	leader := startBoardRegion(t, b)
	b.set(leader.addr)
	u := testUpstream(t, leader.addr)
	u.check, u.probe = 100*time.Millisecond, 200*time.Millisecond
	go func() {
		<-leader.started
		time.Sleep(1500 * time.Millisecond)
		close(leader.hold)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := getReservation(ctx, u); err != nil {
		t.Fatalf("the slow leader's call: %v after %s; want its answer", err, time.Since(start).Round(time.Millisecond))
	}
	if took := time.Since(start); took < 1400*time.Millisecond {
		t.Errorf("answered after %s; the leader held it 1.5 s", took.Round(time.Millisecond))
	}
	if u.Leader() != leader.addr {
		t.Errorf("the upstream calls %s next; want the leader %s", u.Leader(), leader.addr)
	}
}
