package rpcserve

import (
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"

	"google.golang.org/grpc/credentials"
)

// Refusal names the limit that closed a connection: the limit label of the metric
// quota_connections_refused_total (internal/metrics).
type Refusal string

// The limits a connection can be refused by (Limits).
const (
	// RefusedTotal: the listener had MaxConnections open.
	RefusedTotal Refusal = "total"
	// RefusedPerAddress: the client's address had MaxConnectionsPerIP open.
	RefusedPerAddress Refusal = "per_address"
	// RefusedPerCertificate: the client's certificate had MaxConnectionsPerCert open.
	RefusedPerCertificate Refusal = "per_certificate"
	// RefusedHandshake: the client's address had MaxHandshakesPerIP in their handshake.
	RefusedHandshake Refusal = "handshake"
	// RefusedAnonymous: MaxAnonymousConnections were open without a client certificate.
	RefusedAnonymous Refusal = "anonymous"
)

// Refusals is every Refusal, so that a metric can make each series at the start.
func Refusals() []Refusal {
	return []Refusal{RefusedTotal, RefusedPerAddress, RefusedPerCertificate, RefusedHandshake, RefusedAnonymous}
}

// limited is a listener whose connections a limiter bounds: those beyond a bound at arrival
// (total, per address, in their handshake per address) are closed as they arrive, so a flood
// of idle or never-handshaking connections costs a file descriptor each only within the
// bounds; those beyond a bound at the end of their handshake (per certificate, without a
// certificate) are closed then: connState for HTTP, establishing for gRPC.
type limited struct {
	net.Listener
	lim     *limiter
	log     *slog.Logger
	refusal func(Refusal) // nil: none counted
}

// limitListener bounds l by lim; the bounds that need the end of a connection's handshake
// (connections in their handshake per address, per certificate, without a certificate) hold
// only on a secure server, whose handshakes mark their end (establishing, connState).
func limitListener(l net.Listener, lim Limits, secure bool, opts Options) *limited {
	return &limited{Listener: l, lim: newLimiter(lim, secure), log: opts.Logger, refusal: opts.Refused}
}

// Accept returns the next connection within the limits, closing those beyond them.
func (l *limited) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		s, why := l.lim.admit(addressKey(c.RemoteAddr()))
		if why != "" {
			l.refuse(c, why)
			continue
		}
		return &counted{Conn: c, slot: s}, nil
	}
}

// refuse closes a connection a limit turned away, counts it, and says so at debug level: a
// flood would fill any higher level.
func (l *limited) refuse(c net.Conn, why Refusal) {
	if l.refusal != nil {
		l.refusal(why)
	}
	l.log.Debug("connection refused", "limit", string(why), "remote", c.RemoteAddr().String(), "close_err", c.Close())
}

// addressKey is the key a client's address is bounded by: an IPv4 address itself, an IPv6
// address's /64 (a host is usually given a whole /64, so one address each would let one host
// pass as 2^64). An address that is not IP (a test's pipe) shares the zero key.
func addressKey(a net.Addr) netip.Prefix {
	var ip netip.Addr
	if t, ok := a.(*net.TCPAddr); ok {
		ip = t.AddrPort().Addr()
	} else if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		ip = ap.Addr()
	}
	ip = ip.Unmap().WithZone("")
	if !ip.IsValid() {
		return netip.Prefix{}
	}
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

// certificateKey is the key a client certificate is bounded by: the SHA-256 of the leaf the
// handshake verified, or nil when it verified none. A certificate, not its subject: the
// subject is shared (every `quotactl cert client --role storefront` without --name is CN
// storefront), so one leaked certificate would take the slots of every other with its name;
// and its holder cannot make another without the CA's key.
func certificateKey(state *tls.ConnectionState) *certKey {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return nil
	}
	k := certKey(sha256.Sum256(state.VerifiedChains[0][0].Raw))
	return &k
}

// counted is a connection of a limited listener: its close gives its slots back.
type counted struct {
	net.Conn
	slot *slot
}

// Close closes the connection and gives its slots back. Idempotent.
func (c *counted) Close() error {
	c.slot.release()
	return c.Conn.Close()
}

// establishing wraps a secure gRPC server's TLS credentials: once a connection's handshake is
// over it gives back the connection's handshake slot and counts the connection against its
// certificate's bound, or, when it presented no verified client certificate (it may only
// check health), against the budget of those, closing it past either.
type establishing struct {
	credentials.TransportCredentials
	l *limited
}

// errRefused is the handshake's error for a connection a limit closed after its handshake.
var errRefused = errors.New("connection refused by a limit")

// ServerHandshake performs the TLS handshake and applies the bounds.
func (e *establishing) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := e.TransportCredentials.ServerHandshake(raw)
	c, ok := raw.(*counted)
	if !ok {
		return conn, info, err
	}
	c.slot.handshook()
	if err != nil {
		return conn, info, err
	}
	var state *tls.ConnectionState
	if t, ok := info.(credentials.TLSInfo); ok {
		state = &t.State
	}
	if why := c.slot.establish(certificateKey(state)); why != "" {
		e.l.refuse(conn, why)
		return nil, nil, fmt.Errorf("%w: %s", errRefused, why)
	}
	return conn, info, nil
}

// Clone keeps the limits shared with the clone.
func (e *establishing) Clone() credentials.TransportCredentials {
	return &establishing{TransportCredentials: e.TransportCredentials.Clone(), l: e.l}
}

// connState is an HTTP server's ConnState hook, establishing's counterpart: at a TLS
// connection's first request (when the server reports it active, its handshake done) it
// gives back the handshake slot and applies the bounds per certificate and without one.
func (l *limited) connState(c net.Conn, s http.ConnState) {
	if s != http.StateActive {
		return
	}
	tc, ok := c.(*tls.Conn)
	if !ok {
		return
	}
	cnt, ok := tc.NetConn().(*counted)
	if !ok {
		return
	}
	state := tc.ConnectionState()
	if why := cnt.slot.establish(certificateKey(&state)); why != "" {
		l.refuse(c, why)
	}
}
