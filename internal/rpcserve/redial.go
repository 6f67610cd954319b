package rpcserve

import (
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

// RedialIfFailed tells conn to dial at once if its last attempt failed, and reports whether
// it did: a caller about to use a connection because its address is the leader as last
// learned would otherwise fail without asking while the connection waits out its backoff.
func RedialIfFailed(conn *grpc.ClientConn) bool {
	if conn.GetState() != connectivity.TransientFailure {
		return false
	}
	conn.ResetConnectBackoff()
	return true
}
