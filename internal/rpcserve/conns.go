package rpcserve

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
)

// limited is a listener that bounds connections twice: at most max open, and at most
// perIP from one address still in their handshake (the TLS credentials mark a connection
// handshaken: anonymousBudget). Connections beyond either are closed as they arrive, so a
// flood of idle or never-handshaking connections costs a file descriptor each only within
// the bounds.
type limited struct {
	net.Listener
	max, perIP int64
	open       atomic.Int64
	mu         sync.Mutex
	pending    map[string]int64 // address → connections in their handshake
	log        *slog.Logger
}

// limitListener bounds l by lim; the bound on handshakes per address holds only on a secure
// server, whose credentials (anonymousBudget) mark a connection's handshake done.
func limitListener(l net.Listener, lim Limits, secure bool, log *slog.Logger) net.Listener {
	perIP := int64(lim.MaxHandshakesPerIP)
	if !secure {
		perIP = int64(lim.MaxConnections)
	}
	return &limited{Listener: l, max: int64(lim.MaxConnections), perIP: perIP, pending: map[string]int64{}, log: log}
}

// Accept returns the next connection within the limits, closing those beyond them.
func (l *limited) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := hostOf(c.RemoteAddr())
		if !l.admit(ip) {
			refused(l.log, c, "connection limit")
			continue
		}
		return &counted{Conn: c, l: l, ip: ip}, nil
	}
}

// admit counts a new connection from ip, unless a limit is reached.
func (l *limited) admit(ip string) bool {
	if l.open.Add(1) > l.max {
		l.open.Add(-1)
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending[ip] >= l.perIP {
		l.open.Add(-1)
		return false
	}
	l.pending[ip]++
	return true
}

func (l *limited) handshaken(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending[ip]--; l.pending[ip] <= 0 {
		delete(l.pending, ip)
	}
}

// refused closes a connection a limit turned away and says so at debug level: a flood would
// fill any higher level.
func refused(log *slog.Logger, c net.Conn, limit string) {
	log.Debug("connection refused", "limit", limit, "remote", c.RemoteAddr().String(), "close_err", c.Close())
}

func hostOf(a net.Addr) string {
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// counted is a connection of a limited listener: its close gives its slots back.
type counted struct {
	net.Conn
	l         *limited
	ip        string
	handshake sync.Once
	once      sync.Once
	// release, when set, gives back a budget the connection counts against (an HTTP
	// connection without a certificate, httpBudget); called once, at Close.
	release  atomic.Pointer[func()]
	budgeted atomic.Bool
}

// handshook gives back the connection's handshake slot; idempotent.
func (c *counted) handshook() { c.handshake.Do(func() { c.l.handshaken(c.ip) }) }

// Close closes the connection and gives its slots back. Idempotent.
func (c *counted) Close() error {
	c.handshook()
	c.once.Do(func() {
		c.l.open.Add(-1)
		if f := c.release.Swap(nil); f != nil {
			(*f)()
		}
	})
	return c.Conn.Close()
}

// anonymousBudget wraps a secure server's TLS credentials. Once a connection's handshake is
// over it gives back its handshake slot (limited); and a connection that presented no
// verified client certificate, which may only check health, counts against a budget of its
// own, so that callers without a certificate cannot take the slots certified clients need.
type anonymousBudget struct {
	credentials.TransportCredentials
	max  int64
	open *atomic.Int64
	log  *slog.Logger
}

var errTooManyAnonymous = errors.New("too many connections without a client certificate")

// ServerHandshake performs the TLS handshake and applies the budget.
func (b *anonymousBudget) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := b.TransportCredentials.ServerHandshake(raw)
	if c, ok := raw.(*counted); ok {
		c.handshook()
	}
	if err != nil {
		return conn, info, err
	}
	if t, ok := info.(credentials.TLSInfo); ok && len(t.State.VerifiedChains) > 0 {
		return conn, info, nil
	}
	if b.open.Add(1) > b.max {
		b.open.Add(-1)
		refused(b.log, conn, "connections without a certificate")
		return nil, nil, errTooManyAnonymous
	}
	return &anonymous{Conn: conn, release: func() { b.open.Add(-1) }}, info, nil
}

// Clone keeps the budget shared with the clone.
func (b *anonymousBudget) Clone() credentials.TransportCredentials {
	return &anonymousBudget{TransportCredentials: b.TransportCredentials.Clone(), max: b.max, open: b.open, log: b.log}
}

// anonymous is a connection without a client certificate: its close gives its budget back.
type anonymous struct {
	net.Conn
	release func()
	once    sync.Once
}

// Close closes the connection and gives its slot back. Idempotent.
func (a *anonymous) Close() error {
	a.once.Do(a.release)
	return a.Conn.Close()
}
