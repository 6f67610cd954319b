package rpcserve

import (
	"crypto/sha256"
	"net/netip"
	"sync"
)

// certKey is a client certificate's SHA-256 fingerprint (certificateKey).
type certKey [sha256.Size]byte

// limiter counts one listener's connections against its Limits: open in all, open per
// address, in their handshake per address, open per client certificate, and open without
// one. Its maps are bounded by construction: a key stays only while a connection holds it,
// and at most max connections are open, so neither map ever has more than max keys.
type limiter struct {
	max, perIP, handshakesPerIP, perCert, anonymous int64
	// secure: the server's handshakes mark their end (slot.handshook), so the bound on
	// connections in their handshake holds; a plaintext server has no handshake to wait for.
	secure bool

	mu     sync.Mutex
	open   int64
	anon   int64
	byAddr map[netip.Prefix]*addrCount
	byCert map[certKey]int64
}

// addrCount is one address's connections: open, and those of them in their handshake.
type addrCount struct{ open, pending int64 }

func newLimiter(lim Limits, secure bool) *limiter {
	return &limiter{max: int64(lim.MaxConnections), perIP: int64(lim.MaxConnectionsPerIP), handshakesPerIP: int64(lim.MaxHandshakesPerIP),
		perCert: int64(lim.MaxConnectionsPerCert), anonymous: int64(lim.MaxAnonymousConnections), secure: secure,
		byAddr: map[netip.Prefix]*addrCount{}, byCert: map[certKey]int64{}}
}

// admit counts a new connection from addr, or names the limit it is beyond.
func (l *limiter) admit(addr netip.Prefix) (*slot, Refusal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.max {
		return nil, RefusedTotal
	}
	a := l.byAddr[addr]
	if a == nil {
		a = &addrCount{}
	}
	switch {
	case a.open >= l.perIP:
		return nil, RefusedPerAddress
	case l.secure && a.pending >= l.handshakesPerIP:
		return nil, RefusedHandshake
	}
	l.byAddr[addr] = a
	l.open++
	a.open++
	if l.secure {
		a.pending++
	}
	return &slot{l: l, addr: addr, pending: l.secure}, ""
}

// slot is one admitted connection's share of its limiter's counts. Its methods are safe for
// concurrent use and each takes effect once.
type slot struct {
	l    *limiter
	addr netip.Prefix
	// Under l.mu:
	pending     bool     // counted in its address's handshakes
	established bool     // establish has run
	cert        *certKey // counted against this certificate
	anon        bool     // counted without a certificate
	closed      bool
}

// handshook gives back the connection's handshake slot.
func (s *slot) handshook() {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	s.handshookLocked()
}

func (s *slot) handshookLocked() {
	if s.pending {
		s.pending = false
		s.l.byAddr[s.addr].pending--
	}
}

// establish ends the connection's handshake and counts it against cert's bound (the verified
// client certificate's fingerprint), or, nil, against the bound of connections without one;
// it names the limit the connection is beyond, if it is. Only its first call counts: later
// ones (an HTTP connection's later requests) answer "".
func (s *slot) establish(cert *certKey) Refusal {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	s.handshookLocked()
	if s.established || s.closed {
		return ""
	}
	s.established = true
	if cert == nil {
		if l.anon >= l.anonymous {
			return RefusedAnonymous
		}
		l.anon++
		s.anon = true
		return ""
	}
	if l.byCert[*cert] >= l.perCert {
		return RefusedPerCertificate
	}
	l.byCert[*cert]++
	s.cert = cert
	return ""
}

// release gives back every count the connection holds, at its close.
func (s *slot) release() {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.handshookLocked()
	l.open--
	a := l.byAddr[s.addr]
	if a.open--; a.open <= 0 {
		delete(l.byAddr, s.addr)
	}
	if s.anon {
		l.anon--
	}
	if s.cert != nil {
		if l.byCert[*s.cert]--; l.byCert[*s.cert] <= 0 {
			delete(l.byCert, *s.cert)
		}
	}
}
