package rpcserve

import (
	"crypto/sha256"
	"net"
	"net/netip"
	"testing"
)

// step is one event of a connection in a limiter table test; conn is the connection's index
// in its case, given by its "admit".
type step struct {
	op   string // admit, handshook, establish, close
	conn int
	addr string // admit: the client's address
	cert string // establish: the certificate ("" none)
	want Refusal
}

func admit(conn int, addr string, want Refusal) step {
	return step{op: "admit", conn: conn, addr: addr, want: want}
}

func establish(conn int, cert string, want Refusal) step {
	return step{op: "establish", conn: conn, cert: cert, want: want}
}

func handshook(conn int) step { return step{op: "handshook", conn: conn} }

func closeConn(conn int) step { return step{op: "close", conn: conn} }

// TestLimiter: each bound refuses the connection past it and no other, a close frees what
// the connection held, and a second close, or a second establish, changes nothing.
func TestLimiter(t *testing.T) {
	const a, b, c, d = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"
	lim := Limits{MaxConnections: 4, MaxConnectionsPerIP: 2, MaxHandshakesPerIP: 1, MaxConnectionsPerCert: 2, MaxAnonymousConnections: 1}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"per address, freed by a close", []step{
			admit(0, a, ""), handshook(0), admit(1, a, ""), handshook(1), admit(2, a, RefusedPerAddress),
			admit(3, b, ""), closeConn(0), admit(4, a, ""),
		}},
		{"in their handshake per address", []step{
			admit(0, a, ""), admit(1, a, RefusedHandshake), admit(2, b, ""), establish(0, "s", ""), admit(3, a, ""),
		}},
		{"per certificate from any address, freed by a close", []step{
			admit(0, a, ""), establish(0, "s", ""), admit(1, b, ""), establish(1, "s", ""),
			admit(2, c, ""), establish(2, "s", RefusedPerCertificate), closeConn(2),
			admit(3, d, ""), establish(3, "t", ""), closeConn(0), admit(4, c, ""), establish(4, "s", ""),
		}},
		{"without a certificate, freed by a close", []step{
			admit(0, a, ""), establish(0, "", ""), admit(1, b, ""), establish(1, "", RefusedAnonymous), closeConn(1),
			admit(2, c, ""), establish(2, "s", ""), closeConn(0), admit(3, d, ""), establish(3, "", ""),
		}},
		{"in all, freed by a close", []step{
			admit(0, a, ""), handshook(0), admit(1, a, ""), admit(2, b, ""), handshook(2), admit(3, b, ""),
			admit(4, c, RefusedTotal), closeConn(3), admit(5, c, ""), admit(6, d, RefusedTotal),
		}},
		{"a second close frees nothing more", []step{
			admit(0, a, ""), handshook(0), admit(1, a, ""), establish(1, "s", ""), closeConn(0), closeConn(0), closeConn(0),
			admit(2, a, ""), handshook(2), admit(3, a, RefusedPerAddress),
			admit(4, b, ""), establish(4, "s", ""), closeConn(1), closeConn(1),
			admit(5, c, ""), establish(5, "s", ""), admit(6, d, ""), establish(6, "s", RefusedPerCertificate),
		}},
		{"a second establish counts nothing more", []step{
			admit(0, a, ""), establish(0, "s", ""), establish(0, "s", ""), establish(0, "", ""),
			admit(1, b, ""), establish(1, "s", ""), admit(2, c, ""), establish(2, "", ""),
		}},
		{"a connection closed in its handshake counts nothing", []step{
			admit(0, a, ""), closeConn(0), establish(0, "", ""), handshook(0), admit(1, a, ""), establish(1, "", ""),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(lim, true)
			slots := play(t, l, tc.steps)
			for _, s := range slots {
				s.release()
			}
			if l.open != 0 || l.anon != 0 || len(l.byAddr) != 0 || len(l.byCert) != 0 {
				t.Errorf("every connection closed: open %d, without a certificate %d, addresses %v, certificates %d; want none",
					l.open, l.anon, l.byAddr, len(l.byCert))
			}
		})
	}
}

// play plays steps on l, reporting each answer that differs from its want and any moment the
// maps hold more keys than there are open connections; it returns the connections admitted.
func play(t *testing.T, l *limiter, steps []step) map[int]*slot {
	t.Helper()
	slots := map[int]*slot{}
	for i, s := range steps {
		var got Refusal
		switch s.op {
		case "admit":
			var sl *slot
			if sl, got = l.admit(netip.PrefixFrom(netip.MustParseAddr(s.addr), 32)); sl != nil {
				slots[s.conn] = sl
			}
		case "handshook":
			slots[s.conn].handshook()
		case "establish":
			var k *certKey
			if s.cert != "" {
				sum := certKey(sha256.Sum256([]byte(s.cert)))
				k = &sum
			}
			got = slots[s.conn].establish(k)
		case "close":
			slots[s.conn].release()
		default:
			t.Fatalf("step %d: op %q", i, s.op)
		}
		if got != s.want {
			t.Errorf("step %d (%s conn %d %s%s): %q, want %q", i, s.op, s.conn, s.addr, s.cert, got, s.want)
		}
		if int64(len(l.byAddr)) > l.open || int64(len(l.byCert)) > l.open {
			t.Errorf("step %d: %d addresses and %d certificates kept for %d connections", i, len(l.byAddr), len(l.byCert), l.open)
		}
	}
	return slots
}

// TestLimiterPlaintext: a plaintext server has no handshake to wait for, so only the bounds
// in all and per address hold.
func TestLimiterPlaintext(t *testing.T) {
	l := newLimiter(Limits{MaxConnections: 3, MaxConnectionsPerIP: 2, MaxHandshakesPerIP: 1}, false)
	play(t, l, []step{admit(0, "10.0.0.1", ""), admit(1, "10.0.0.1", ""), admit(2, "10.0.0.1", RefusedPerAddress),
		admit(3, "10.0.0.2", ""), admit(4, "10.0.0.3", RefusedTotal)})
}

// TestAddressKey: an IPv4 address is its own key, also written as IPv6; an IPv6 address's key
// is its /64.
func TestAddressKey(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 1}, "127.0.0.2/32"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 1}, "10.1.2.3/32"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::/64"},
		{&net.UnixAddr{Name: "@x", Net: "unix"}, "invalid Prefix"},
	} {
		if got := addressKey(tc.addr).String(); got != tc.want {
			t.Errorf("addressKey(%v) = %s, want %s", tc.addr, got, tc.want)
		}
	}
	if addressKey(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1")}) != addressKey(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::9")}) {
		t.Error("two addresses of one /64 have different keys")
	}
}
