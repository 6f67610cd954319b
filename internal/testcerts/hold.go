package testcerts

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/quotaworks/quota/internal/trust"
)

// holdTimeout bounds each step of Hold: the dial, the handshake, the server's answer.
const holdTimeout = 5 * time.Second

// http2Preface is what an HTTP/2 client sends first: the preface and an empty SETTINGS frame.
var http2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// LocalDialer dials from the address from (an IP such as "127.0.0.2"; "" lets the system
// pick), so a test can be a second client address: Linux routes all of 127.0.0.0/8 to the
// loopback interface.
func LocalDialer(from string) *net.Dialer {
	d := &net.Dialer{Timeout: holdTimeout}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	return d
}

// Holder opens TLS connections presenting one role's certificate from one local address
// and holds them open as idle clients do, for tests that play a client hoarding connections.
type Holder struct {
	cfg  *tls.Config
	from string
}

// NewHolder is a Holder presenting role's certificate of m ("": none) from the address from
// (an IP such as "127.0.0.2"; "" lets the system pick).
func NewHolder(m *trust.Material, role trust.Role, from string) (*Holder, error) {
	cfg, err := m.ClientConfig(trust.Auditor)
	if err != nil {
		return nil, err
	}
	if role == "" {
		cfg.Certificates = nil
	} else if cfg, err = m.ClientConfig(role); err != nil {
		return nil, err
	}
	// X25519 alone: the default's post-quantum key share would cost a flood of thousands of
	// connections (most of them refused before the server reads a byte) seconds under -race.
	cfg.CurvePreferences = []tls.CurveID{tls.X25519}
	return &Holder{cfg: cfg, from: from}, nil
}

// dialTLS opens a TLS connection to addr, offering proto by ALPN.
func (h *Holder) dialTLS(addr, proto string) (*tls.Conn, error) {
	cfg := h.cfg.Clone()
	cfg.NextProtos = []string{proto}
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg.ServerName = host
	}
	raw, err := LocalDialer(h.from).Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, cfg)
	if err := c.SetDeadline(time.Now().Add(holdTimeout)); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := c.Handshake(); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// HoldGRPC opens a connection to the gRPC server at addr as an idle gRPC client keeps one:
// TLS, then HTTP/2's preface, answered by the server's settings; then nothing. It returns the
// open connection, or the error of one the server closed (a limit) or did not answer.
func (h *Holder) HoldGRPC(addr string) (net.Conn, error) {
	c, err := h.dialTLS(addr, "h2")
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(http2Preface); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if _, err := c.Read(make([]byte, 9)); err != nil { // the server's SETTINGS frame header
		return nil, errors.Join(fmt.Errorf("no answer to the HTTP/2 preface: %w", err), c.Close())
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// HoldHTTP opens a connection to the HTTP server at addr as an idle HTTP/1.1 client keeps
// one: TLS, one GET of path, its answer read whole; then nothing. It returns the open
// connection and the answer's status, or the error of a connection the server closed (a
// limit) or did not answer.
func (h *Holder) HoldHTTP(addr, path string) (net.Conn, int, error) {
	c, err := h.dialTLS(addr, "http/1.1")
	if err != nil {
		return nil, 0, err
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return nil, 0, errors.Join(err, c.Close())
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, 0, errors.Join(fmt.Errorf("no answer to GET %s: %w", path, err), c.Close())
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if err = errors.Join(err, resp.Body.Close(), c.SetDeadline(time.Time{})); err != nil {
		return nil, 0, errors.Join(err, c.Close())
	}
	return c, resp.StatusCode, nil
}
