// Package testnet hands tests loopback ports that stay free until the test binds them.
//
// A port found by listening on 127.0.0.1:0 and closing again comes from Linux's ephemeral
// range (32768..60999 by default), the same range the kernel picks source ports from for
// every outgoing connection. Between the close and the bind of the server under test, any
// connection made meanwhile (a PostgreSQL pool, an etcd client, another test package running
// in parallel) may take the port, and the server fails with "address already in use". The
// ports handed out here lie below that range, where only explicit binds land, and are picked
// at random so that test processes running side by side rarely try the same one.
package testnet

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Low and High bound the ports handed out when the ephemeral range is Linux's default
// (32768..60999): above the ports most daemons use, below the ephemeral range. Range
// narrows or moves them on a machine whose ephemeral range is configured otherwise.
const (
	Low  = 10000
	High = 32000
)

var window struct {
	once     sync.Once
	lo, hi   int
	ephemera string
}

// Range is the window ports are handed out from, [lo, hi): [Low, High) cut below the
// machine's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), or above it when
// too little is left below.
func Range() (lo, hi int) {
	window.once.Do(func() {
		window.lo, window.hi = Low, High
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return // not Linux: keep the defaults
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return
		}
		elo, err1 := strconv.Atoi(f[0])
		ehi, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return
		}
		window.ephemera = string(b)
		if elo < window.hi {
			window.hi = elo
		}
		if window.hi-window.lo < 2000 && ehi < 63000 {
			window.lo, window.hi = ehi+1, 65536
		}
	})
	return window.lo, window.hi
}

var given struct {
	sync.Mutex
	ports map[int]bool
}

// Base returns a port base such that base+off is free on 127.0.0.1 for every off in offsets
// (each at least 0), and no earlier call in this process handed out any of them.
func Base(t testing.TB, offsets ...int) int {
	t.Helper()
	top := 0
	for _, off := range offsets {
		if off < 0 {
			t.Fatalf("testnet.Base: offset %d is negative", off)
		}
		top = max(top, off)
	}
	lo, hi := Range()
	if top >= hi-lo {
		t.Fatalf("testnet.Base: offset %d leaves no room in ports %d..%d (ephemeral range %q)", top, lo, hi, window.ephemera)
	}
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	for range 500 {
		base := lo + rand.IntN(hi-lo-top)
		if allFree(base, offsets) {
			for _, off := range offsets {
				given.ports[base+off] = true
			}
			return base
		}
	}
	t.Fatal("testnet.Base: no free port range found below the ephemeral range")
	return 0
}

func allFree(base int, offsets []int) bool {
	for _, off := range offsets {
		if given.ports[base+off] {
			return false
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+off))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// Port returns one free port (see Base).
func Port(t testing.TB) int {
	t.Helper()
	return Base(t, 0)
}

// Addr returns "127.0.0.1:<free port>".
func Addr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(Port(t))
}

// URL returns "http://127.0.0.1:<free port>", as etcd's listen URLs want.
func URL(t testing.TB) string {
	t.Helper()
	return "http://" + Addr(t)
}
