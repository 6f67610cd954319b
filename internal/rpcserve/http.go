package rpcserve

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// HTTPServer is an HTTP/1.1 and HTTP/2 server (the storefront's JSON edge) with the TLS of
// every quotad listener and the same limits: connections, handshake time, idle time, header
// and body sizes (the handler bounds bodies).
type HTTPServer struct {
	srv      *http.Server
	listener net.Listener
	done     chan error
	stopOnce sync.Once
	log      *slog.Logger
}

// maxHeaderBytes bounds a request's headers.
const maxHeaderBytes = 16 << 10

// ListenHTTP listens on addr for h: TLS 1.3 with client certificates checked against the
// cluster's CA when opts.TLS is set (the handler authorizes each route), plaintext HTTP/1.1
// and h2c under --insecure.
func ListenHTTP(addr string, h http.Handler, opts Options) (*HTTPServer, error) {
	lim := opts.Limits.withDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	var tlsCfg *tls.Config
	if opts.TLS.Insecure() {
		protos.SetUnencryptedHTTP2(true)
	} else {
		cfg, err := opts.TLS.ServerConfig()
		if err != nil {
			return nil, err
		}
		cfg.NextProtos = []string{"h2", "http/1.1"}
		if opts.Public {
			cfg.ClientAuth, cfg.ClientCAs = tls.NoClientCert, nil
			lim.MaxAnonymousConnections = lim.MaxConnections
		}
		tlsCfg = cfg
		protos.SetHTTP2(true)
	}
	lis, err := listenTCP(addr, opts.ReusePort)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	limits := limitListener(lis, lim, tlsCfg != nil, opts)
	var l net.Listener = limits
	if tlsCfg != nil {
		l = tls.NewListener(l, tlsCfg)
	}
	srv := &http.Server{Handler: h, Protocols: &protos, ReadHeaderTimeout: lim.HandshakeTimeout,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: lim.MaxConnectionIdle,
		MaxHeaderBytes: maxHeaderBytes, ErrorLog: slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: int(lim.MaxConcurrentStreams)}, ConnState: limits.connState}
	return &HTTPServer{srv: srv, listener: l, log: opts.Logger}, nil
}

// ErrReusePort: Options.ReusePort asked for on a system without SO_REUSEPORT support here.
var ErrReusePort = errors.New("SO_REUSEPORT is supported on Linux only")

// listenTCP listens on addr, with SO_REUSEPORT when reusePort is set.
func listenTCP(addr string, reusePort bool) (net.Listener, error) {
	var lc net.ListenConfig
	if reusePort {
		if reusePortControl == nil {
			return nil, ErrReusePort
		}
		lc.Control = reusePortControl
	}
	return lc.Listen(context.Background(), "tcp", addr)
}

// Addr is the address the server listens on.
func (s *HTTPServer) Addr() string { return s.listener.Addr().String() }

// Start serves in the background.
func (s *HTTPServer) Start() {
	s.done = make(chan error, 1)
	go func() { s.done <- s.srv.Serve(s.listener) }()
}

// httpDrain bounds how long Stop lets requests in flight finish.
const httpDrain = 5 * time.Second

// Stop stops the server, letting requests in flight finish for a few seconds, then closing
// what remains; a server never started has its listener closed. Idempotent.
func (s *HTTPServer) Stop() {
	s.stopOnce.Do(func() {
		if s.done == nil {
			_ = s.listener.Close() // never served: nothing else holds it, nothing to do about an error
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), httpDrain)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.log.Warn("http requests still running after the drain; closing them", "err", err, "close", s.srv.Close())
		}
		if err := <-s.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Warn("http server ended", "err", err)
		}
	})
}

// WriteJSON answers code with v as JSON and a new line, the one way the HTTP edges write a
// body. v is one of the caller's own types, so a marshal error is a programmer error.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("rpcserve: marshal %T: %v", v, err))
	}
	b = append(b, '\n')
	WriteEncoded(w, code, b, strconv.Itoa(len(b)))
}

// WriteEncoded answers code with body, JSON already encoded with its new line (as WriteJSON
// writes it), and length, len(body) in decimal: the way to answer a body encoded once and
// shared, such as apierr.AnswerHTTP's.
func WriteEncoded(w http.ResponseWriter, code int, body []byte, length string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", length)
	w.WriteHeader(code)
	if _, err := w.Write(body); err != nil {
		return // the client went away; nothing to tell it
	}
}
