// Package netfault is a TCP proxy for tests that can cut, freeze and heal a link on loopback:
// the in-process stand-in for a network partition between two components, or for a peer that
// is stopped. (toxiproxy does the
// same between processes; this one needs no server of its own.)
package netfault

import (
	"errors"
	"net"
	"sync"
)

// Proxy forwards connections from its own address to an upstream address.
type Proxy struct {
	upstream string
	lis      net.Listener

	mu     sync.Mutex
	cut    bool
	frozen bool
	gate   sync.RWMutex // held while frozen: every pipe waits to write
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen starts a proxy on 127.0.0.1 (a free port) to upstream.
func Listen(upstream string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{upstream: upstream, lis: lis, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial instead of upstream.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Cut drops every open connection and refuses new ones until Heal: both directions are lost.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Freeze stops forwarding while keeping every connection open, and accepts new ones that
// forward nothing either, until Heal: a peer that is stopped (SIGSTOP), which answers nothing
// and refuses nothing.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen && !p.closed {
		p.frozen = true
		p.gate.Lock()
	}
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.thaw()
}

// thaw ends a Freeze. Called with p.mu held.
func (p *Proxy) thaw() {
	if p.frozen {
		p.frozen = false
		p.gate.Unlock()
	}
}

// Close stops the proxy and drops its connections. Idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.lis.Close()
	for c := range p.conns {
		c.Close()
	}
	p.thaw() // the pipes waiting to write then meet their closed connections
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.lis.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		if !p.track(down) {
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil || !p.track(up) {
			p.untrack(down)
			continue
		}
		p.wg.Add(2)
		go p.pipe(down, up)
		go p.pipe(up, down)
	}
}

// pipe copies src to dst, each write waiting while the proxy is frozen, until either ends.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(src)
	defer p.untrack(dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate.RLock()
			_, werr := dst.Write(buf[:n])
			p.gate.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection: the link's end
		}
	}
}
