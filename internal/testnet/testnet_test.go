package testnet_test

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/quotaworks/quota/internal/testnet"
)

// TestPortsAreFreeBelowTheEphemeralRangeAndNeverTwice: every port handed out binds, lies in
// Range() (below Linux's ephemeral range, 32768 and up by default), and no port is handed out
// twice in one process.
func TestPortsAreFreeBelowTheEphemeralRangeAndNeverTwice(t *testing.T) {
	offsets := []int{0, 1, 2, 3, 90, 91}
	lo, hi := testnet.Range()
	seen := map[int]bool{}
	for range 50 {
		base := testnet.Base(t, offsets...)
		for _, off := range offsets {
			port := base + off
			if port < lo || port >= hi {
				t.Fatalf("port %d outside [%d, %d)", port, lo, hi)
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
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var elo, ehi int
		if _, err := fmt.Sscan(string(b), &elo, &ehi); err == nil && hi > elo && lo <= ehi {
			t.Errorf("ports [%d, %d) overlap the ephemeral range %d..%d", lo, hi, elo, ehi)
		}
	}
	if u := testnet.URL(t); len(u) < len("http://127.0.0.1:10000") {
		t.Fatalf("URL() = %q", u)
	}
}
