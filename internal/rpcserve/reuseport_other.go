//go:build !linux

package rpcserve

import "syscall"

// reusePortControl is nil where this package does not set SO_REUSEPORT: ListenHTTP refuses
// Options.ReusePort with ErrReusePort.
var reusePortControl func(network, address string, c syscall.RawConn) error
