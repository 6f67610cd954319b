package rpcserve_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// startSecure serves every service of the project (unimplemented handlers: a call that passes
// authorization answers Unimplemented) over mutual TLS.
func startSecure(t *testing.T, m *trust.Material, lim rpcserve.Limits) *rpcserve.Server {
	t.Helper()
	return startGRPC(t, rpcserve.Options{TLS: m, Limits: lim})
}

// startGRPC is startSecure with opts.
func startGRPC(t *testing.T, opts rpcserve.Options) *rpcserve.Server {
	t.Helper()
	s, err := rpcserve.Listen("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	quotav1.RegisterRegionServiceServer(s.GRPC, quotav1.UnimplementedRegionServiceServer{})
	quotav1.RegisterParticipantServiceServer(s.GRPC, quotav1.UnimplementedParticipantServiceServer{})
	quotav1.RegisterCoordinatorServiceServer(s.GRPC, quotav1.UnimplementedCoordinatorServiceServer{})
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// everyMethod is every RPC of the project's services, by full method name.
func everyMethod() []string {
	var out []string
	for _, sd := range []grpc.ServiceDesc{quotav1.RegionService_ServiceDesc, quotav1.ParticipantService_ServiceDesc, quotav1.CoordinatorService_ServiceDesc} {
		for _, m := range sd.Methods {
			out = append(out, "/"+sd.ServiceName+"/"+m.MethodName)
		}
	}
	return out
}

// call invokes method with an empty request (every request message decodes from zero bytes).
func call(ctx context.Context, conn *grpc.ClientConn, method string) error {
	return conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
}

// TestEveryRPCEveryRole: over real TLS, each role may call exactly what the table allows; a
// refused call is PermissionDenied naming the role and the method, and never reaches the
// handler.
func TestEveryRPCEveryRole(t *testing.T) {
	m := testcerts.New(t)
	s := startSecure(t, m, rpcserve.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	methods := everyMethod()
	if len(methods) < 20 {
		t.Fatalf("found %d methods; the services have more", len(methods))
	}
	for _, role := range trust.Roles {
		conn := testcerts.Dial(t, m, s.Addr(), role)
		for _, method := range methods {
			err := call(ctx, conn, method)
			allowed := trust.Allowed(role, method)
			switch code := status.Code(err); {
			case allowed && code != codes.Unimplemented:
				t.Errorf("%s %s: %v; want it to reach the handler (Unimplemented)", role, method, err)
			case !allowed && code != codes.PermissionDenied:
				t.Errorf("%s %s: %v; want PermissionDenied", role, method, err)
			case !allowed && apierr.Reason(err) != "PERMISSION_DENIED":
				t.Errorf("%s %s: reason %q; want PERMISSION_DENIED", role, method, apierr.Reason(err))
			case !allowed && !contains(status.Convert(err).Message(), string(role), method):
				t.Errorf("%s %s: message %q does not name the role and the method", role, method, status.Convert(err).Message())
			}
		}
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestMatrix pins the documented role matrix (docs/security.md): a change to the table must
// change this test and the docs with it.
func TestMatrix(t *testing.T) {
	want := map[trust.Role][]string{
		trust.Storefront: {"RegionService/Reserve", "RegionService/Confirm", "RegionService/Release", "RegionService/GetReservation", "RegionService/GetStock", "CoordinatorService/ListRegions",
			"RegionService/DescribeSale", "RegionService/Enter", "RegionService/GetAdmission", "RegionService/JoinWaitlist", "RegionService/ListBuyerHolds", "RegionService/LineChanges"},
		trust.Coordinator: {"ParticipantService/PutSale", "ParticipantService/Credit", "ParticipantService/Debit", "ParticipantService/RefuseDebit", "ParticipantService/Refuse", "ParticipantService/Restore", "ParticipantService/Settle", "ParticipantService/TransferStatus", "ParticipantService/SetPaused", "ParticipantService/NodeStatus"},
		trust.Operator: {"CoordinatorService/CreateSale", "CoordinatorService/Allocate", "CoordinatorService/Transfer", "CoordinatorService/ResolveTransfer", "CoordinatorService/Rebalance",
			"CoordinatorService/PauseSale", "CoordinatorService/ResumeSale",
			"CoordinatorService/GetSale", "CoordinatorService/Audit", "CoordinatorService/AuditHistory", "CoordinatorService/AuditLimits", "CoordinatorService/ListLatePayments", "CoordinatorService/ListActions", "CoordinatorService/GetStatus", "CoordinatorService/GetTransfer", "CoordinatorService/ListTransfers", "CoordinatorService/ListRegions",
			"CoordinatorService/PlanRebalance", "RegionService/GetReservation", "RegionService/GetStock", "RegionService/DescribeSale", "RegionService/ListBuyerHolds"},
		trust.Auditor: {"CoordinatorService/GetSale", "CoordinatorService/Audit", "CoordinatorService/AuditHistory", "CoordinatorService/AuditLimits", "CoordinatorService/ListLatePayments", "CoordinatorService/ListActions", "CoordinatorService/GetStatus", "CoordinatorService/GetTransfer", "CoordinatorService/ListTransfers", "CoordinatorService/ListRegions",
			"CoordinatorService/PlanRebalance", "RegionService/GetReservation", "RegionService/GetStock", "RegionService/DescribeSale", "RegionService/ListBuyerHolds"},
	}
	for role, allowed := range want {
		set := map[string]bool{}
		for _, a := range allowed {
			set["/quota.v1."+a] = true
		}
		for _, method := range everyMethod() {
			if got := trust.Allowed(role, method); got != set[method] {
				t.Errorf("%s %s: allowed %v, documented %v", role, method, got, set[method])
			}
		}
	}
	for method := range trust.Methods {
		found := false
		for _, m := range everyMethod() {
			found = found || m == method
		}
		if !found {
			t.Errorf("the table names %s, which no service has", method)
		}
	}
}

// TestWithoutACertificate: a TLS client with no certificate may check health and nothing
// else; a plaintext client cannot talk to a secure server at all.
func TestWithoutACertificate(t *testing.T) {
	m := testcerts.New(t)
	s := startSecure(t, m, rpcserve.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	anon := testcerts.DialAnonymous(t, m, s.Addr())
	if _, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check without a certificate: %v; want it open", err)
	}
	for _, method := range everyMethod() {
		if err := call(ctx, anon, method); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a certificate: %v; want Unauthenticated", method, err)
		}
	}
	stream, err := rpb.NewServerReflectionClient(anon).ServerReflectionInfo(ctx)
	if err == nil {
		// A Send on a stream the server already ended says only io.EOF: Recv has its status.
		if err = stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err == nil || errors.Is(err, io.EOF) {
			_, err = stream.Recv()
		}
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("reflection without a certificate: %v; want Unauthenticated", err)
	}
	plain, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	defer pcancel()
	if _, err := healthpb.NewHealthClient(plain).Check(pctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Errorf("a plaintext client reached a secure server")
	}
}

// TestAnotherCAIsRefused: a certificate from a CA the server does not trust fails the
// handshake, whatever role it names.
func TestAnotherCAIsRefused(t *testing.T) {
	s := startSecure(t, testcerts.New(t), rpcserve.Limits{})
	other := testcerts.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn := testcerts.Dial(t, other, s.Addr(), trust.Operator)
	if err := call(ctx, conn, "/quota.v1.CoordinatorService/CreateSale"); err == nil || status.Code(err) == codes.Unimplemented {
		t.Errorf("a certificate of another CA: %v; want the connection refused", err)
	}
}

// TestConnectionLimit: connections past MaxConnections are closed as they arrive, and the
// ones within it keep working.
func TestConnectionLimit(t *testing.T) {
	m := testcerts.New(t)
	s := startSecure(t, m, rpcserve.Limits{MaxConnections: 8})
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range 8 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	time.Sleep(200 * time.Millisecond) // the server accepts them
	extra, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if err := extra.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := extra.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("the ninth connection: read %v; want it closed by the server", err)
	}
	for _, c := range open {
		c.Close()
	}
	open = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := testcerts.Dial(t, m, s.Addr(), trust.Auditor)
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Errorf("after the idle connections closed, a new one: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestMessageLimit: a request above MaxRecvMsgBytes is refused before any handler runs.
func TestMessageLimit(t *testing.T) {
	m := testcerts.New(t)
	s := startSecure(t, m, rpcserve.Limits{MaxRecvMsgBytes: 4096})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := testcerts.Dial(t, m, s.Addr(), trust.Storefront)
	big := &quotav1.ReserveRequest{SaleId: string(make([]byte, 8192))}
	err := conn.Invoke(ctx, "/quota.v1.RegionService/Reserve", big, &quotav1.ReserveResponse{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("an 8 KiB request to a 4 KiB limit: %v; want ResourceExhausted", err)
	}
}

// TestTableCoversEveryRPC: every RPC of every service has a row in the role table, so a new
// RPC cannot ship refused to everyone (or, worse, be added to the table by no one's review).
func TestTableCoversEveryRPC(t *testing.T) {
	for _, m := range everyMethod() {
		if _, ok := trust.Methods[m]; !ok {
			t.Errorf("%s has no row in trust.Methods", m)
		}
	}
}

// TestAnonymousConnectionsHaveABudget: connections without a client certificate may only
// check health, and only MaxAnonymousConnections of them at once; a certified client still
// connects while they are all taken. Health's Watch stream needs a certificate.
func TestAnonymousConnectionsHaveABudget(t *testing.T) {
	m := testcerts.New(t)
	s := startSecure(t, m, rpcserve.Limits{MaxAnonymousConnections: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ok int
	for range 3 {
		conn := testcerts.DialAnonymous(t, m, s.Addr())
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		if _, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err == nil {
			ok++
		}
		ccancel()
	}
	if ok != 2 {
		t.Errorf("%d of 3 connections without a certificate were served; want the budget of 2", ok)
	}
	certified := testcerts.Dial(t, m, s.Addr(), trust.Auditor)
	if _, err := healthpb.NewHealthClient(certified).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a certified client with the anonymous budget spent: %v", err)
	}
	watch, err := healthpb.NewHealthClient(testcerts.DialAnonymous(t, m, s.Addr())).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = watch.Recv()
	}
	if code := status.Code(err); code != codes.Unauthenticated && code != codes.Unavailable {
		t.Errorf("a Watch without a certificate: %v; want it refused", err)
	}
	cw, err := healthpb.NewHealthClient(certified).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = cw.Recv()
	}
	if err != nil {
		t.Errorf("a Watch with a certificate: %v", err)
	}
}

// TestHandshakesPerAddressAreBounded: connections from one address that never handshake
// take at most MaxHandshakesPerIP slots; past it they are closed at once, and once they are
// gone clients connect again.
func TestHandshakesPerAddressAreBounded(t *testing.T) {
	m := testcerts.New(t)
	s := startSecure(t, m, rpcserve.Limits{MaxHandshakesPerIP: 4, HandshakeTimeout: 30 * time.Second})
	var idle []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	time.Sleep(200 * time.Millisecond)
	extra, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if err := extra.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := extra.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("a fifth connection in its handshake from one address: read %v; want it closed", err)
	}
	for _, c := range idle {
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := testcerts.Dial(t, m, s.Addr(), trust.Auditor)
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Errorf("after the idle connections closed: %v", err)
	}
}
