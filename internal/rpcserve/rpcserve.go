// Package rpcserve runs a gRPC server with what every server of the project has: mutual TLS
// and the role table (internal/trust) unless it runs insecure, limits on messages, streams
// and connections, the standard health service, server reflection (so grpcurl and ghz work),
// and the one error table (apierr) applied to every handler's error, and a request whose
// string field is not UTF-8 answered INVALID_ARGUMENT naming the field (utf8.go).
package rpcserve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// Limits bound what one server accepts from its clients. Zero fields take the defaults.
type Limits struct {
	// MaxRecvMsgBytes is the largest request message (default 1 MiB).
	MaxRecvMsgBytes int
	// MaxConcurrentStreams is the most calls in flight on one connection (default 1,024).
	MaxConcurrentStreams uint32
	// MaxConnections is the most open connections; more are closed as they arrive (default 1,024).
	MaxConnections int
	// MaxConnectionIdle closes a connection with no call for this long (default 5 minutes).
	MaxConnectionIdle time.Duration
	// HandshakeTimeout bounds a new connection's TLS and HTTP/2 handshake (default 5 s).
	HandshakeTimeout time.Duration
	// MaxHandshakesPerIP is the most connections from one address still in their handshake;
	// more are closed as they arrive (default 32), so one host cannot fill the connection
	// slots with connections that never handshake.
	MaxHandshakesPerIP int
	// MaxAnonymousConnections is the most connections without a client certificate, which
	// may only check health (default 64); more are closed after their handshake.
	MaxAnonymousConnections int
	// MaxConnectionsPerIP is the most open connections from one address (an IPv6 address's
	// /64), in their handshake or past it; more are closed as they arrive. The default, 64,
	// is a sixteenth of the default MaxConnections: one host cannot hold more than that
	// share of a port however long it keeps its connections idle, and it takes 16 addresses
	// to fill one. A client needs few: gRPC and HTTP/2 multiplex every call on one
	// connection, and 64 is still 64 HTTP/1.1 requests in flight at once. Clients behind one
	// address (a NAT, a proxy) or a load test from one host may need it raised.
	MaxConnectionsPerIP int
	// MaxConnectionsPerCert is the most open connections presenting one verified client
	// certificate (by its fingerprint), counted from the end of their handshake; more are
	// closed then. The default, 256, is a quarter of the default MaxConnections: a leaked or
	// runaway certificate, from however many addresses, leaves three quarters of a port to
	// the others, while 64 storefront hosts sharing one certificate may hold 4 connections
	// each.
	MaxConnectionsPerCert int
	// StreamWorkers is how many goroutines the server keeps to serve calls (default 256). A
	// call served by one of them does not start a goroutine whose stack then grows, copied
	// at each doubling, through the handler's interceptors; calls beyond it start their own
	// goroutine as without workers.
	StreamWorkers uint32
}

// DefaultLimits are the limits a server has unless told otherwise (docs/security.md).
var DefaultLimits = Limits{MaxRecvMsgBytes: 1 << 20, MaxConcurrentStreams: 1024, MaxConnections: 1024,
	MaxConnectionIdle: 5 * time.Minute, HandshakeTimeout: 5 * time.Second, MaxHandshakesPerIP: 32, MaxAnonymousConnections: 64,
	MaxConnectionsPerIP: 64, MaxConnectionsPerCert: 256, StreamWorkers: 256}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxRecvMsgBytes > 0 {
		d.MaxRecvMsgBytes = l.MaxRecvMsgBytes
	}
	if l.MaxConcurrentStreams > 0 {
		d.MaxConcurrentStreams = l.MaxConcurrentStreams
	}
	if l.MaxConnections > 0 {
		d.MaxConnections = l.MaxConnections
	}
	if l.MaxConnectionIdle > 0 {
		d.MaxConnectionIdle = l.MaxConnectionIdle
	}
	if l.HandshakeTimeout > 0 {
		d.HandshakeTimeout = l.HandshakeTimeout
	}
	if l.MaxHandshakesPerIP > 0 {
		d.MaxHandshakesPerIP = l.MaxHandshakesPerIP
	}
	if l.StreamWorkers > 0 {
		d.StreamWorkers = l.StreamWorkers
	}
	if l.MaxAnonymousConnections > 0 {
		d.MaxAnonymousConnections = l.MaxAnonymousConnections
	}
	if l.MaxConnectionsPerIP > 0 {
		d.MaxConnectionsPerIP = l.MaxConnectionsPerIP
	}
	if l.MaxConnectionsPerCert > 0 {
		d.MaxConnectionsPerCert = l.MaxConnectionsPerCert
	}
	return d
}

// Options configure a server: its certificates (nil: insecure, plaintext and no roles) and
// its limits.
type Options struct {
	TLS    *trust.Material
	Limits Limits
	// Logger receives the connections refused by a limit (at debug level); default slog.Default().
	Logger *slog.Logger
	// Refused, when set, is told of every connection a limit closed, naming the limit (the
	// metric quota_connections_refused_total). It is called on the listener's accepting or
	// handshaking goroutines: it must be quick and safe for concurrent use.
	Refused func(Refusal)
	// Unary and Stream run around every call of a gRPC server, in order, outside the error
	// table and the authorization, so they see each call's final code (the gRPC metrics).
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
	// Guards run inside the error table and the authorization, on the calls the role table
	// allowed (AddressedTo).
	Guards []grpc.UnaryServerInterceptor
	// Public (ListenHTTP only) serves people's browsers, which have no client certificate:
	// the server shows its certificate and asks for none, and the bound on connections
	// without one (MaxAnonymousConnections) gives way to MaxConnections, since every
	// connection is without one. The bounds per address hold as on every listener.
	Public bool
	// ReusePort (ListenHTTP only) binds with SO_REUSEPORT, so that several processes of the
	// same user serve one address and the kernel spreads new connections among the live ones:
	// when one dies, new connections go to the others (a storefront's address outlives any one
	// edge process). Linux only; elsewhere ListenHTTP refuses it (ErrReusePort).
	ReusePort bool
}

// Server is a gRPC server listening on one address.
type Server struct {
	GRPC     *grpc.Server
	Health   *health.Server
	listener net.Listener
	done     chan error
	stopOnce sync.Once
}

func mapErrors(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, apierr.ToStatus(err)
}

// authorize is the one interceptor that applies the role table (trust.Methods) to a call.
func authorize(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := trust.Authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := trust.Authorize(ss.Context(), info.FullMethod); err != nil {
		return apierr.ToStatus(err)
	}
	return h(srv, ss)
}

// Listen binds addr (host:port; port 0 picks a free one) and builds the server; register
// services on GRPC, then call Start. With opts.TLS set, every connection is TLS and every
// call but a health check needs a client certificate whose role the table allows.
func Listen(addr string, opts Options) (*Server, error) {
	creds, err := opts.TLS.ServerCreds()
	if err != nil {
		return nil, err
	}
	lim := opts.Limits.withDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	limits := limitListener(lis, lim, !opts.TLS.Insecure(), opts)
	if !opts.TLS.Insecure() {
		creds = &establishing{TransportCredentials: creds, l: limits}
	}
	unary := append(slices.Clone(opts.Unary), mapErrors)
	stream := slices.Clone(opts.Stream)
	if !opts.TLS.Insecure() {
		unary = append(unary, authorize) // after mapErrors: it maps authorize's refusals too
		stream = append(stream, authorizeStream)
	}
	unary = append(unary, opts.Guards...)
	// Last: a caller the table refuses hears that, not what is wrong with its request.
	unary = append(unary, refuseInvalidUTF8)
	stream = append(stream, refuseInvalidUTF8Stream)
	srv := grpc.NewServer(grpc.Creds(creds), grpc.ForceServerCodecV2(newUTF8Codec()),
		grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...),
		grpc.MaxRecvMsgSize(lim.MaxRecvMsgBytes), grpc.MaxConcurrentStreams(lim.MaxConcurrentStreams),
		grpc.ConnectionTimeout(lim.HandshakeTimeout), grpc.NumStreamWorkers(lim.StreamWorkers),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: lim.MaxConnectionIdle, Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	s := &Server{GRPC: srv, Health: health.NewServer(), listener: limits}
	healthpb.RegisterHealthServer(s.GRPC, s.Health)
	reflection.Register(s.GRPC)
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Start serves in the background.
func (s *Server) Start() {
	s.done = make(chan error, 1)
	go func() { s.done <- s.GRPC.Serve(s.listener) }()
}

// Stop stops the server, letting running calls finish. Idempotent.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.Health.Shutdown()
		s.GRPC.GracefulStop()
		if s.done != nil {
			<-s.done
		}
	})
}
