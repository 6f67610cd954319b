package region

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// op is one state change decided and written inside a batch transaction. apply returns the
// op's result and its business outcome (sold out, limit, ...: the batch still commits), or
// a fatal error that aborts the whole batch. apply may run more than once (transaction
// retries), so it keeps no state outside its return values and the batch.
type op interface {
	apply(ctx context.Context, tx pgx.Tx, b *batch) (res any, outcome error, fatal error)
}

// batch is what the ops of one transaction share: the decision time and the pools whose
// available count they changed (applied to the in-memory cache only after the commit).
type batch struct {
	now     time.Time
	touched map[poolKey]transfer.Units
	sales   map[string]SaleTerms
}

type pending struct {
	op   op
	res  any
	err  error
	done chan struct{}
}

// writer is the region's single writer: every state change of the region's database goes
// through it, in batches of up to max ops per transaction, so many requests share one commit
// and the in-memory cache is exact (nothing else writes). A request is answered only after
// its batch committed (I6).
type writer struct {
	pool     *pgxpool.Pool
	clock    clock.Clock
	epoch    int64
	max      int
	window   time.Duration
	in       chan *pending
	onCommit func(b *batch)
	onFail   func(err error)

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func (w *writer) start() {
	w.stop = make(chan struct{})
	w.wg.Add(1)
	go w.run()
}

// close stops the writer and fails every request still queued. Idempotent.
func (w *writer) close() {
	w.stopOnce.Do(func() { close(w.stop) })
	w.wg.Wait()
}

// submit queues o and waits for its batch to commit. A canceled ctx after queuing leaves
// the outcome unknown: the caller must ask again with the same key.
func (w *writer) submit(ctx context.Context, o op) (any, error) {
	p := &pending{op: o, done: make(chan struct{})}
	select {
	case w.in <- p:
	case <-w.stop:
		return nil, fmt.Errorf("region writer stopped: %w", ErrNotLeader)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-p.done:
		return p.res, p.err
	case <-w.stop:
		// Queued after the writer drained its queue? Once it has exited, an unanswered op
		// was never applied.
		w.wg.Wait()
		select {
		case <-p.done:
			return p.res, p.err
		default:
			return nil, fmt.Errorf("region writer stopped: %w", ErrNotLeader)
		}
	case <-ctx.Done():
		return nil, fmt.Errorf("%w (%v)", ErrUnknownOutcome, ctx.Err())
	}
}

func (w *writer) run() {
	defer w.wg.Done()
	for {
		var first *pending
		select {
		case <-w.stop:
			w.failQueued()
			return
		case first = <-w.in:
		}
		w.commit(w.collect(first))
	}
}

// collect gathers what is already queued behind first (and, with a window, what arrives
// within it), up to max ops.
func (w *writer) collect(first *pending) []*pending {
	ps := []*pending{first}
	var timeout <-chan time.Time
	if w.window > 0 {
		t := time.NewTimer(w.window)
		defer t.Stop()
		timeout = t.C
	}
	for len(ps) < w.max {
		select {
		case p := <-w.in:
			ps = append(ps, p)
			continue
		default:
		}
		if timeout == nil {
			break
		}
		select {
		case p := <-w.in:
			ps = append(ps, p)
			continue
		case <-timeout:
		}
		break
	}
	return ps
}

func (w *writer) commit(ps []*pending) {
	type result struct {
		res any
		err error
	}
	results := make([]result, len(ps))
	var b *batch
	inFn := false
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := pgutil.Tx(ctx, w.pool, func(tx pgx.Tx) error {
		inFn = true
		// The database keeps microseconds: decide at the stored precision, so the hold a
		// request is answered with is the hold a read or a replay returns, and a deadline
		// compares the same before and after it was stored.
		b = &batch{now: w.clock.Now().Truncate(time.Microsecond), touched: map[poolKey]transfer.Units{}, sales: map[string]SaleTerms{}}
		if err := fencing.CheckEpoch(ctx, tx, w.epoch); err != nil {
			return err
		}
		for i, p := range ps {
			res, outcome, fatal := p.op.apply(ctx, tx, b)
			if fatal != nil {
				return fatal
			}
			results[i] = result{res, outcome}
		}
		inFn = false
		return nil
	})
	if err != nil {
		// Failed inside fn: rolled back, nothing committed. Failed at commit: unknown.
		if !inFn && !errors.Is(err, ErrFenced) {
			err = fmt.Errorf("%w: commit: %v", ErrUnknownOutcome, err)
		}
		for _, p := range ps {
			p.err = err
			close(p.done)
		}
		w.onFail(err)
		return
	}
	w.onCommit(b)
	for i, p := range ps {
		p.res, p.err = results[i].res, results[i].err
		close(p.done)
	}
}

func (w *writer) failQueued() {
	for {
		select {
		case p := <-w.in:
			p.err = fmt.Errorf("region writer stopped: %w", ErrNotLeader)
			close(p.done)
		default:
			return
		}
	}
}
