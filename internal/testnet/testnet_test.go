package testnet_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/quotaworks/quota/internal/testnet"
)

// TestPortsAreFreeBelowTheEphemeralRangeAndNeverTwice: every port handed out binds, lies in
// [Low, High) (below Linux's ephemeral range, 32768 and up by default), and no port is handed
// out twice in one process.
func TestPortsAreFreeBelowTheEphemeralRangeAndNeverTwice(t *testing.T) {
	offsets := []int{0, 1, 2, 3, 90, 91}
	seen := map[int]bool{}
	for range 50 {
		base := testnet.Base(t, offsets...)
		for _, off := range offsets {
			port := base + off
			if port < testnet.Low || port >= testnet.High {
				t.Fatalf("port %d outside [%d, %d)", port, testnet.Low, testnet.High)
			}
			if seen[port] {
				t.Fatalf("port %d handed out twice", port)
			}
			seen[port] = true
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				t.Fatalf("port %d: %v", port, err)
			}
			l.Close()
		}
	}
	if u := testnet.URL(t); len(u) < len("http://127.0.0.1:10000") {
		t.Fatalf("URL() = %q", u)
	}
}
