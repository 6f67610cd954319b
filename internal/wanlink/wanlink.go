// Package wanlink is a TCP proxy that delays every byte it forwards by a fixed one-way delay
// plus jitter, both ways: a link across an ocean, between processes on one machine whose
// kernel has no netem. Delays are per chunk read, measured from the moment the chunk was
// read, and order is kept (a chunk is never written before an earlier one), so a stream's
// throughput is the link's, not one chunk per delay.
package wanlink

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// Limits on a route's settings and on the bytes a link holds in flight.
const (
	// MaxDelay bounds a route's one-way delay and its jitter.
	MaxDelay = 10 * time.Second
	// chunkSize is the most one read takes; queueChunks bounds the chunks in flight per
	// direction of a connection (at most queueChunks*chunkSize bytes held).
	chunkSize   = 32 << 10
	queueChunks = 256
	// MaxConns bounds the connections one link carries at once; more are refused.
	MaxConns = 4096
)

// ErrBadRoute is a route that cannot be parsed or whose settings are out of range.
var ErrBadRoute = errors.New("bad route")

// Route is one proxied link: connections to Listen are forwarded to Upstream, every byte
// delayed by Delay ± a uniform random jitter of at most Jitter (never below zero), both ways.
type Route struct {
	Name             string
	Listen, Upstream string
	Delay, Jitter    time.Duration
}

// ParseRoute parses NAME=LISTEN=UPSTREAM=DELAY[=JITTER], e.g.
// "us>eu/etcd2=127.0.0.1:7411=127.0.0.1:7582=40ms=3ms".
func ParseRoute(s string) (Route, error) {
	f := strings.Split(s, "=")
	if len(f) != 4 && len(f) != 5 {
		return Route{}, fmt.Errorf("route %q: %w: want name=listen=upstream=delay[=jitter]", s, ErrBadRoute)
	}
	r := Route{Name: f[0], Listen: f[1], Upstream: f[2]}
	if r.Name == "" {
		return Route{}, fmt.Errorf("route %q: name: %w: empty", s, ErrBadRoute)
	}
	for field, addr := range map[string]string{"listen": r.Listen, "upstream": r.Upstream} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return Route{}, fmt.Errorf("route %s: %s %q: %w: want host:port", r.Name, field, addr, ErrBadRoute)
		}
	}
	var err error
	if r.Delay, err = parseDelay(r.Name, "delay", f[3]); err != nil {
		return Route{}, err
	}
	if len(f) == 5 {
		if r.Jitter, err = parseDelay(r.Name, "jitter", f[4]); err != nil {
			return Route{}, err
		}
	}
	return r, nil
}

func parseDelay(name, field, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxDelay {
		return 0, fmt.Errorf("route %s: %s %q: %w: want a duration from 0 to %s", name, field, s, ErrBadRoute, MaxDelay)
	}
	return d, nil
}

// sample is one delay of r: Delay plus a uniform jitter in [-Jitter, Jitter], at least 0.
func (r Route) sample() time.Duration {
	d := r.Delay
	if r.Jitter > 0 {
		d += time.Duration(rand.Int64N(int64(2*r.Jitter)+1)) - r.Jitter
	}
	return max(d, 0)
}

// Link serves one route until Close.
type Link struct {
	route Route
	lis   net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen starts serving r.
func Listen(r Route) (*Link, error) {
	lis, err := net.Listen("tcp", r.Listen)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r.Name, err)
	}
	l := &Link{route: r, lis: lis, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address the link listens on.
func (l *Link) Addr() string { return l.lis.Addr().String() }

// Close stops the link and drops its connections; it waits for its goroutines. Idempotent.
func (l *Link) Close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		_ = l.lis.Close() // its only error is a second close
		for c := range l.conns {
			_ = c.Close()
		}
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// track registers c, or closes it when the link is closed or full.
func (l *Link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || len(l.conns) >= MaxConns {
		_ = c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close() // closed already by the other direction, or by Close
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		down, err := l.lis.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // out of descriptors, say: do not spin
			continue
		}
		if !l.track(down) {
			continue
		}
		up, err := net.DialTimeout("tcp", l.route.Upstream, 5*time.Second)
		if err != nil || !l.track(up) {
			l.untrack(down)
			continue
		}
		l.wg.Add(2)
		go l.pipe(up, down)
		go l.pipe(down, up)
	}
}

// chunk is bytes read at one moment, due to be written at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk written once its delay has passed since it was read;
// when either side ends, both connections are closed.
func (l *Link) pipe(dst, src net.Conn) {
	defer l.wg.Done()
	q := make(chan chunk, queueChunks)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer close(q)
		var last time.Time
		buf := make([]byte, chunkSize) // read into one buffer; each chunk holds a copy of its bytes only
		for {
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(l.route.sample())
				if due.Before(last) {
					due = last // keep the order: never before an earlier chunk
				}
				last = due
				q <- chunk{b: slices.Clone(buf[:n]), due: due}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	l.untrack(dst)
	l.untrack(src)
	for range q { // let the reader, unblocked by the close, finish
	}
}
