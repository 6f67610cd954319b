package pgutil

import "time"

// SetListenHeartbeat sets Listen's heartbeat for a test and returns the undo.
func SetListenHeartbeat(d time.Duration) (undo func()) {
	old := listenHeartbeat
	listenHeartbeat = d
	return func() { listenHeartbeat = old }
}

// BackendStarts counts the connections whose backend start is recorded.
func BackendStarts() (n int) {
	backendStarts.Range(func(any, any) bool { n++; return true })
	return n
}
