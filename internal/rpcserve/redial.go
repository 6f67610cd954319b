package rpcserve

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
)

// PeerConnect is how a connection from one of the project's processes to another (an edge
// or a coordinator to a region process) redials after a failure: soon, and never more than a
// second apart, since the process at an address that failed (a leader killed and restarted
// on its port) may be the one named leader next. gRPC's default waits up to two minutes.
var PeerConnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// RedialWait bounds how long RedialIfFailed waits for the attempt it starts.
const RedialWait = 250 * time.Millisecond

// RedialIfFailed tells conn to dial at once if its last attempt failed, waits (RedialWait at
// most, and within ctx) until that attempt has connected or failed, and reports whether it
// redialed: a caller about to use a connection because its address is the leader as last
// learned would otherwise fail without asking while the connection waits out its backoff, or
// while the new attempt is still under way.
func RedialIfFailed(ctx context.Context, conn *grpc.ClientConn) bool {
	if conn.GetState() != connectivity.TransientFailure {
		return false
	}
	conn.ResetConnectBackoff()
	conn.Connect()
	ctx, cancel := context.WithTimeout(ctx, RedialWait)
	defer cancel()
	left := false // the state has moved on from the failure that was reset
	for s := conn.GetState(); ; s = conn.GetState() {
		switch {
		case s == connectivity.Ready || s == connectivity.Shutdown:
			return true
		case s == connectivity.TransientFailure && left:
			return true // the new attempt failed too
		case s != connectivity.TransientFailure:
			left = true
		}
		if !conn.WaitForStateChange(ctx, s) {
			return true
		}
	}
}
