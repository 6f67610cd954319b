package rpcserve

import (
	"context"
	"fmt"
	"strings"

	"github.com/quotaworks/quota/internal/apierr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// RegionHeader is the gRPC metadata key naming the region a coordinator's call is meant
// for. The coordinator finds each region's leader by the address it published in etcd; a
// false address there (or a stale one now taken by another region's process) would send one
// region's transfer steps to another. Every call carries the region it is for, and a region
// refuses a call meant for another (AddressedTo).
const RegionHeader = "quota-region"

// participantPrefix names the ParticipantService's methods, the calls AddressedTo checks.
const participantPrefix = "/quota.v1.ParticipantService/"

// WithRegion is a client interceptor that names region in every call (RegionHeader).
func WithRegion(region string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(metadata.AppendToOutgoingContext(ctx, RegionHeader, region), method, req, reply, cc, opts...)
	}
}

// AddressedTo is a guard (Options.Guards) of region name's server: a ParticipantService call
// that names another region in RegionHeader is refused as a conflict, naming both, and
// changes nothing. A call that names none (a client of its own, such as a test) is served.
func AddressedTo(name string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, participantPrefix) {
			return h(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		for _, want := range md.Get(RegionHeader) {
			if want != name {
				return nil, fmt.Errorf("this is region %s; the call is meant for region %s (a false or stale leader address in etcd?): %w",
					name, want, apierr.ErrConflict)
			}
		}
		return h(ctx, req)
	}
}
