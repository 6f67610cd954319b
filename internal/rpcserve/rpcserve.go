// Package rpcserve runs a gRPC server with what every server of the project has: the
// standard health service, server reflection (so grpcurl and ghz work), and the one error
// table (apierr) applied to every handler's error.
package rpcserve

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/quotaworks/quota/internal/apierr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

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

// Listen binds addr (host:port; port 0 picks a free one) and builds the server; register
// services on GRPC, then call Start.
func Listen(addr string) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	s := &Server{GRPC: grpc.NewServer(grpc.ChainUnaryInterceptor(mapErrors)), Health: health.NewServer(), listener: lis}
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
