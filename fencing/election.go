package fencing

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Client is a connection to etcd.
type Client struct {
	c *clientv3.Client
}

// Dial connects to etcd at endpoints, in plaintext.
func Dial(endpoints []string, timeout time.Duration) (*Client, error) {
	return DialTLS(endpoints, timeout, nil)
}

// DialTLS connects to etcd at endpoints with TLS (a client certificate in cfg.Certificates,
// the CA in cfg.RootCAs), or in plaintext when cfg is nil. The endpoints must all be
// https:// with a cfg and must not be https:// without one.
func DialTLS(endpoints []string, timeout time.Duration, cfg *tls.Config) (*Client, error) {
	c, err := DialTLSLazy(endpoints, timeout, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := c.c.Get(ctx, "/quota/ping"); err != nil {
		_ = c.Close() // the read's error is the one to report
		return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	return c, nil
}

// DialTLSLazy is DialTLS without its first read: the client connects when first used, so a
// member that is down now is found out by the calls made through it, not refused here.
func DialTLSLazy(endpoints []string, timeout time.Duration, cfg *tls.Config) (*Client, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("etcd: no endpoints")
	}
	for _, ep := range endpoints {
		if secure := strings.HasPrefix(ep, "https://"); secure != (cfg != nil) {
			if secure {
				return nil, fmt.Errorf("etcd endpoint %s: https:// needs a TLS config", ep)
			}
			return nil, fmt.Errorf("etcd endpoint %s: want https:// with TLS", ep)
		}
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, TLS: cfg})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	return &Client{c: c}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

// Leadership is a won election. Generation is the leader key's create revision: etcd's
// revision only rises, so every later leader of the same role has a higher one.
type Leadership struct {
	Generation int64
	session    *concurrency.Session
	election   *concurrency.Election
	closeOnce  sync.Once
}

// Done is closed when the leadership's lease is lost (expired, revoked or closed). The
// holder must stop acting as leader when it closes; fences make any late write harmless.
func (l *Leadership) Done() <-chan struct{} { return l.session.Done() }

// Close resigns and releases the lease. Idempotent.
func (l *Leadership) Close() {
	l.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = l.election.Resign(ctx)
		_ = l.session.Close()
	})
}

// Abandon stops renewing the lease without resigning, as a crashed process would: another
// candidate takes over only once the lease expires. Tests use it to crash a leader in-process.
func (l *Leadership) Abandon() {
	l.closeOnce.Do(func() { l.session.Orphan() })
}

func electionKey(role string) string { return "/quota/election/" + role }

// Campaign blocks until this process leads role (or ctx ends). value is published for
// followers and clients (the leader's address). ttl is the lease: a leader that stops
// renewing it is replaced after about ttl.
func Campaign(ctx context.Context, c *Client, role, value string, ttl time.Duration) (*Leadership, error) {
	secs := int(ttl / time.Second)
	if secs < 1 {
		secs = 1
	}
	s, err := concurrency.NewSession(c.c, concurrency.WithTTL(secs))
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	e := concurrency.NewElection(s, electionKey(role))
	// A candidate's session can expire while it waits (its etcd member paused or cut off
	// for longer than ttl): its key is then gone, so it is no candidate at all, yet
	// Election.Campaign would wait on. Give up with the session, so the caller campaigns
	// again under a new one and is a standby again.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	if err := e.Campaign(cctx, value); err != nil {
		s.Close()
		if ctx.Err() == nil && cctx.Err() != nil {
			err = fmt.Errorf("the etcd session expired while waiting: %w", ErrSessionExpired)
		}
		return nil, fmt.Errorf("campaign %s: %w", role, err)
	}
	return &Leadership{Generation: e.Rev(), session: s, election: e}, nil
}

// Leader returns the value published by role's current leader and its generation, or
// ErrNotLeader when nobody leads.
func Leader(ctx context.Context, c *Client, role string) (string, int64, error) {
	resp, err := c.c.Get(ctx, electionKey(role)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", 0, fmt.Errorf("leader of %s: %w", role, err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, fmt.Errorf("%s: nobody leads: %w", role, ErrNotLeader)
	}
	kv := resp.Kvs[0]
	return string(kv.Value), kv.CreateRevision, nil
}
