package regionedge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Upstream is an edge's client of its region's leader: it calls whichever of the region's
// processes leads, following each NOT_LEADER answer's leader address, and trying the
// region's other known processes when the answer names none (a leader just died) or a
// process does not answer. It keeps one connection per address it has called, at most
// maxConns: past them the least recently used connection no call is using is closed, so
// leaders restarted on new ports (or bad hints) never use the bound up. A connection is
// closed only when no call is on it, and one that is closed is never handed out again.
type Upstream struct {
	region string
	seeds  []string
	creds  credentials.TransportCredentials
	mu     sync.Mutex
	conns  map[string]*upConn
	uses   uint64 // counts the calls handed a connection: each conn's last use
	cur    string
	next   int // the seed tried after cur fails
	// check and probe are the liveness check of an attempt (DefaultLivenessCheck,
	// DefaultLivenessProbe).
	check, probe time.Duration
	closed       bool
}

// upConn is one connection of an upstream, with the calls on it now and when it was last
// handed to one.
type upConn struct {
	addr     string
	conn     *grpc.ClientConn
	client   quotav1.RegionServiceClient
	inFlight int
	lastUse  uint64
	redialAt time.Time // when a failed connection may next be told to dial at once
}

// maxConns bounds the addresses an upstream keeps a connection to: the seeds and the
// leaders NOT_LEADER answers named.
const maxConns = 32

// maxFeedBytes bounds one answer an edge reads from the leader: a full line of
// admission.DefaultMaxQueue entries fits in it.
const maxFeedBytes = 64 << 20

// NewUpstream is a client of region's processes at seeds (their gRPC addresses), calling
// with creds (the storefront's certificate, or insecure).
func NewUpstream(region string, seeds []string, creds credentials.TransportCredentials) (*Upstream, error) {
	if len(seeds) == 0 {
		return nil, errors.New("upstream: name at least one of the region's gRPC addresses")
	}
	if len(seeds) > maxConns/2 {
		return nil, fmt.Errorf("upstream: %d addresses, over %d", len(seeds), maxConns/2)
	}
	return &Upstream{region: region, seeds: seeds, creds: creds, conns: map[string]*upConn{}, cur: seeds[0],
		check: DefaultLivenessCheck, probe: DefaultLivenessProbe}, nil
}

// Leader is the address the upstream calls now (the leader as last learned).
func (u *Upstream) Leader() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cur
}

// acquire hands out the connection to the current address, counted as in use until
// release: the current one, or a new one (in place of the least recently used idle one once
// maxConns are open); redial says the caller should first make a failed connection dial at
// once (mayRedial).
func (u *Upstream) acquire() (c *upConn, redial bool, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, false, errors.New("upstream closed")
	}
	c, ok := u.conns[u.cur]
	if !ok {
		if len(u.conns) >= maxConns && !u.evictIdle() {
			return nil, false, &apierr.OverloadedError{What: fmt.Sprintf("the edge's connections to region %s (%d, each in use, none to %s)",
				u.region, len(u.conns), u.cur), RetryAfter: time.Second}
		}
		conn, err := grpc.NewClient(u.cur, grpc.WithTransportCredentials(u.creds),
			grpc.WithConnectParams(rpcserve.PeerConnect),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxFeedBytes)))
		if err != nil {
			return nil, false, err
		}
		c = &upConn{addr: u.cur, conn: conn, client: quotav1.NewRegionServiceClient(conn)}
		u.conns[u.cur] = c
	}
	redial = c.mayRedial(time.Now())
	u.uses++
	c.inFlight++
	c.lastUse = u.uses
	return c, redial, nil
}

// redialMinGap bounds how often a failed connection is told to dial at once.
const redialMinGap = 100 * time.Millisecond

// mayRedial reports whether a call handed c may tell its connection to dial at once when
// its last attempt failed (rpcserve.RedialIfFailed): the upstream hands it out because its
// address is the leader as last learned, and the process there may have come back since. At
// most once per redialMinGap. Called with u.mu held.
func (c *upConn) mayRedial(now time.Time) bool {
	if now.Before(c.redialAt) || c.conn.GetState() != connectivity.TransientFailure {
		return false
	}
	c.redialAt = now.Add(redialMinGap)
	return true
}

// evictIdle closes the least recently used connection no call is using, and reports whether
// there was one. Called with u.mu held.
func (u *Upstream) evictIdle() bool {
	var victim *upConn
	for _, c := range u.conns {
		if c.inFlight == 0 && (victim == nil || c.lastUse < victim.lastUse) {
			victim = c
		}
	}
	if victim == nil {
		return false
	}
	delete(u.conns, victim.addr)
	_ = victim.conn.Close() // no call is on it: nothing to do about an error
	return true
}

// release ends a call's use of c.
func (u *Upstream) release(c *upConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	c.inFlight--
}

// moveOn makes the next call go to hint, or, with none, to the next seed; only if the
// address that failed is still the current one (another call may have moved on already).
func (u *Upstream) moveOn(failed, hint string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cur != failed {
		return
	}
	if hint != "" && hint != failed {
		u.cur = hint
		return
	}
	u.cur = u.seeds[u.next%len(u.seeds)]
	u.next++
	if u.cur == failed && len(u.seeds) > 1 {
		u.cur = u.seeds[u.next%len(u.seeds)]
		u.next++
	}
}

// The liveness check of a call's attempt at one process: an attempt that has run
// DefaultLivenessCheck asks the process, on the same connection, whether it is there at all
// (a gRPC health check, any answer will do, even a refusal), and again every
// DefaultLivenessCheck while it runs; a process that does not answer that within
// DefaultLivenessProbe is frozen (stopped, or its machine paused: its connections stay open
// and it answers nothing), and the attempt counts as one that got no answer. A process that is
// only slow (a binding waiting on etcd, a batch on a slow database) answers the check and is
// waited for, as long as the caller waits. Without it a frozen leader would hold every call
// until its caller gave up, and the edge would never try the standby that has taken over.
const (
	DefaultLivenessCheck = time.Second
	DefaultLivenessProbe = time.Second
)

// call runs fn against the region's leader: a NOT_LEADER answer, or an address that does
// not answer (or is found frozen by the liveness check), moves on (to the leader it names,
// or the next process) and calls again, a few times with short pauses, within ctx. Each
// retry is safe: NOT_LEADER was decided by no one, and every forwarded call is idempotent by
// its key (a reservation's request key, a buyer's one place in line, a hold's id). Other
// answers are returned as they came.
func (u *Upstream) call(ctx context.Context, fn func(context.Context, quotav1.RegionServiceClient) error) error {
	attempts := 2*len(u.seeds) + 3
	var err error
	for i := range attempts {
		if i > 0 {
			if serr := sleepCtx(ctx, time.Duration(min(i*i*20, 400))*time.Millisecond); serr != nil {
				break
			}
		}
		c, redial, cerr := u.acquire()
		if cerr != nil {
			return cerr
		}
		if redial {
			rpcserve.RedialIfFailed(ctx, c.conn)
		}
		actx, cancel := context.WithCancel(ctx)
		w := u.watch(actx, cancel, c.conn)
		err = fn(actx, c.client)
		frozen := w.stop() && ctx.Err() == nil
		cancel()
		u.release(c)
		if frozen {
			err = fmt.Errorf("%s answers nothing, not even a health check within %s: %w", c.addr, u.probe, err)
		} else if !apierr.AskAnother(err) {
			return err
		}
		u.moveOn(c.addr, apierr.LeaderHint(err))
	}
	return &apierr.NotLeaderError{Role: "region " + u.region + " (no process answered as its leader: " + errorText(err) + ")"}
}

// watchdog is the liveness check of one attempt (DefaultLivenessCheck): its timer, and
// whether the process was found frozen (the attempt then cancelled).
type watchdog struct {
	mu     sync.Mutex
	t      *time.Timer
	ended  bool
	frozen bool
}

// watch starts the liveness check of an attempt on conn whose context is ctx (cancel ends
// it): every u.check while the attempt runs, a health check that must answer within u.probe.
func (u *Upstream) watch(ctx context.Context, cancel context.CancelFunc, conn *grpc.ClientConn) *watchdog {
	w := &watchdog{}
	var check func()
	check = func() {
		pctx, pcancel := context.WithTimeout(ctx, u.probe)
		_, err := healthpb.NewHealthClient(conn).Check(pctx, &healthpb.HealthCheckRequest{})
		pcancel()
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case w.ended:
		case status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil: // no answer in time
			w.frozen = true
			cancel()
		default: // any answer: the process is there
			w.t = time.AfterFunc(u.check, check)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = time.AfterFunc(u.check, check)
	return w
}

// stop ends the liveness check of an attempt that has returned, and says whether it found
// the process frozen.
func (w *watchdog) stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	w.t.Stop()
	return w.frozen
}

func errorText(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Close closes every connection, cutting the calls on them; idempotent.
func (u *Upstream) Close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for a, c := range u.conns {
		_ = c.conn.Close() // closing: nothing to do about an error
		delete(u.conns, a)
	}
}
