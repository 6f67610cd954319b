package cluster

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/quotaworks/quota/fencing"
)

// term describes what a process campaigns for: the role in etcd, and how the role's holder
// starts leading with its generation, learns that it stopped by itself, and steps down.
type term struct {
	etcd    *fencing.Client
	role    string
	addr    string
	ttl     time.Duration
	log     *slog.Logger
	lead    func(ctx context.Context, gen int64) error
	stopped func() <-chan struct{} // nil: the holder never stops by itself
	stepDn  func()
	crashed *atomic.Bool // set: leave the lease to expire instead of resigning, as a killed process would
	// tookOver, when set, learns how long each takeover took, from the election won to lead's
	// return (quota_takeover_seconds).
	tookOver func(time.Duration)
}

// campaign wins the role, leads until the lease is lost, the holder stops by itself or ctx
// ends, steps down, resigns, and campaigns again, until ctx ends.
func campaign(ctx context.Context, t term) {
	for ctx.Err() == nil {
		l, err := fencing.Campaign(ctx, t.etcd, t.role, t.addr, t.ttl)
		if err != nil {
			if ctx.Err() == nil {
				t.log.Warn("campaign failed", "role", t.role, "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		won := time.Now()
		if err := leadWhileHeld(ctx, t, l); err != nil {
			t.log.Warn("could not lead", "role", t.role, "err", err)
			l.Close()
			sleep(ctx, time.Second)
			continue
		}
		if t.tookOver != nil {
			t.tookOver(time.Since(won))
		}
		var stopped <-chan struct{}
		if t.stopped != nil {
			stopped = t.stopped()
		}
		select {
		case <-l.Done():
			t.log.Warn("lost the lease", "role", t.role)
		case <-stopped:
			// The holder stopped itself (fenced, or it could not reload after a failed batch):
			// resign so a standby, or this process after a pause, can take over.
			t.log.Warn("stopped leading; resigning", "role", t.role)
			sleep(ctx, time.Second)
		case <-ctx.Done():
		}
		t.stepDn()
		if t.crashed.Load() {
			l.Abandon()
		} else {
			l.Close()
		}
	}
}

// leadWhileHeld runs t.lead with a context that also ends when the lease is lost: taking
// over can wait on the database (a region's epoch raise ends a stalled older leader's
// transaction and retries), and a process whose lease has expired must stop that at once,
// or it could end the raise of the leader that has since replaced it.
func leadWhileHeld(ctx context.Context, t term, l *fencing.Leadership) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.Done():
			cancel()
		case <-lctx.Done():
		}
	}()
	return t.lead(lctx, l.Generation)
}
