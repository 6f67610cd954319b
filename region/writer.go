package region

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/transfer"
)

// op is one state change. Most ops (reserve, confirm, release, expire) are decided in the
// leader's memory (batch.m) and leave their SQL effects in batch.w, written once for the
// whole batch; the rare ops that come from the coordinator run SQL themselves through
// batch.sqlOp. apply returns the op's result, of the type T its kind answers with, and its
// business outcome (sold out, limit, ...: the batch still commits), or a fatal error that
// fails the whole batch.
type op[T any] interface {
	apply(ctx context.Context, b *batch) (res T, outcome error, fatal error)
}

// verdict is how applying one op ended: its business outcome, which its caller is told once
// the batch commits, or a fatal error, which fails the whole batch.
type verdict struct{ outcome, fatal error }

// batch is what the ops of one transaction share: the decision time, the leader's memory,
// the writes not yet sent, and what the caches learn once the batch commits.
type batch struct {
	now     time.Time
	touched map[poolKey]transfer.Units
	sales   map[string]SaleTerms
	m       *memState
	w       *writes
	overlay map[string]*memHold // holds created or changed by this batch, by id
	keys    map[keyKey]*memHold // the same, by idempotency key
	db      *pgxpool.Pool
	epoch   int64
	stamp   int64 // the changed stamp of the holds this batch writes (standby.go)
	tx      pgx.Tx
	opSavepoint
	// aside is the region's waitlist book (nil in the simulation's core), and asideDelta
	// this batch's changes to it, applied once the batch commits (aside.go).
	aside      *asideBook
	asideDelta map[poolKey]transfer.Units
	// archived are the holds this batch moved to the archive (archiveOp): they leave memory
	// once it commits.
	archived []Hold
}

// opSavepoint is the savepoint of the coordinator's op being applied (fencedOp), sp, and
// spAvail the pool counts it changed, applied to memory only once the savepoint is released
// (endOp).
type opSavepoint struct {
	sp      pgx.Tx
	spAvail map[poolKey]transfer.Units
}

// begin opens the batch's transaction on first use, first passing the epoch fence (I4): a
// batch of a deposed leader writes nothing. A batch that only read memory never opens one.
func (b *batch) begin(ctx context.Context) (pgx.Tx, error) {
	if b.tx != nil {
		return b.tx, nil
	}
	tx, err := b.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := fencing.CheckEpoch(ctx, tx, b.epoch); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	b.tx = tx
	return tx, nil
}

// flush sends the writes decided in memory so far.
func (b *batch) flush(ctx context.Context) error {
	if b.w.empty() {
		return nil
	}
	tx, err := b.begin(ctx)
	if err != nil {
		return err
	}
	return b.w.flush(ctx, tx, b.now, b.stamp)
}

// sqlOp prepares for an op that reads and writes SQL itself: the database must first hold
// every decision taken before it in the batch.
func (b *batch) sqlOp(ctx context.Context) (pgx.Tx, error) {
	if err := b.flush(ctx); err != nil {
		return nil, err
	}
	return b.begin(ctx)
}

// fencedOp prepares a coordinator's op (sqlOp), then passes the sale's generation fence in
// the batch's transaction (I4). A fenced request is an outcome (the batch goes on); failing
// to reach the database is fatal to the batch.
//
// The op runs inside a savepoint of its own: a statement the database refuses fails this op
// alone (endOp), never the other requests of the batch, and forces no reload.
func (b *batch) fencedOp(ctx context.Context, sale string, gen int64) (tx pgx.Tx, outcome, fatal error) {
	tx, fatal = b.sqlOp(ctx)
	if fatal != nil {
		return nil, nil, fatal
	}
	if b.sp != nil {
		panic("region: a coordinator op began inside another's savepoint") // programmer error
	}
	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		return nil, nil, fmt.Errorf("savepoint: %w", err)
	}
	b.sp, b.spAvail = sp, map[poolKey]transfer.Units{}
	if err := fencing.CheckSaleGeneration(ctx, sp, sale, gen); err != nil {
		return nil, err, nil
	}
	return sp, nil, nil
}

// endOp closes the savepoint of the op just applied, if it opened one. When the op
// succeeded (or ended in an outcome), the savepoint is released and the pool counts it
// changed reach memory. When the database refused one of the op's own statements (a
// constraint, a bad value), the savepoint is rolled back and that error becomes the op's
// answer: the batch goes on and commits the other requests (I6 for them), and memory is
// untouched, so no reload is needed. Any other failure stays fatal to the batch.
func (b *batch) endOp(ctx context.Context, v verdict) verdict {
	sp, avail := b.sp, b.spAvail
	if sp == nil {
		return v
	}
	b.sp, b.spAvail = nil, nil
	if v.fatal != nil {
		if !statementError(v.fatal) {
			return v
		}
		if err := sp.Rollback(ctx); err != nil {
			return verdict{fatal: fmt.Errorf("%w (rolling back to the savepoint: %v)", v.fatal, err)}
		}
		return verdict{outcome: fmt.Errorf("refused by the database, nothing changed: %w", v.fatal)}
	}
	if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
		return verdict{fatal: fmt.Errorf("release savepoint: %w", err)}
	}
	for k, a := range avail {
		b.applyAvailable(k, a)
	}
	return verdict{outcome: v.outcome}
}

// statementError reports whether err is the database refusing one statement (integrity,
// data or syntax classes) on a connection that is still good, as opposed to a lost
// connection, a shutdown or a resource failure.
func statementError(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || len(pg.Code) < 2 {
		return false
	}
	switch pg.Code[:2] {
	case "22", "23", "42", "P0": // data exception, integrity violation, syntax or access, PL/pgSQL raise
		return true
	}
	return false
}

// hold returns a hold as this batch sees it: its own change, or the committed one.
func (b *batch) hold(id string) *memHold {
	if h, ok := b.overlay[id]; ok {
		return h
	}
	return b.m.holds[id] // the writer is the only one changing the map: no lock to read it
}

// key returns the hold of an idempotency key as this batch sees it.
func (b *batch) key(k keyKey) (*memHold, bool) {
	if h, ok := b.keys[k]; ok {
		return h, true
	}
	h, ok := b.m.keys[k]
	return h, ok
}

// put records a hold this batch created or changed; it is published after the commit.
func (b *batch) put(h *memHold) {
	b.overlay[h.ID] = h
	b.keys[keyKey{h.Sale, h.User, h.RequestKey}] = h
}

// setAvailable records a pool's available count after a SQL op changed it; inside an op's
// savepoint, once the savepoint is released.
func (b *batch) setAvailable(k poolKey, a transfer.Units) {
	if b.sp != nil {
		b.spAvail[k] = a
		return
	}
	b.applyAvailable(k, a)
}

func (b *batch) applyAvailable(k poolKey, a transfer.Units) {
	p := b.m.pools[k]
	if p == nil {
		p = &memPool{}
		b.m.pools[k] = p
	}
	p.available = a
	b.touched[k] = a
}

// pending is an op waiting for the writer, whatever its result's type (request).
type pending interface {
	// applyIn applies the op in b and ends its savepoint (batch.endOp), keeping its result
	// until the batch is done.
	applyIn(ctx context.Context, b *batch) verdict
	// answer tells the caller the result kept by applyIn and the op's outcome, once the
	// batch committed.
	answer(outcome error)
	// fail tells the caller err, and no result: the op was never applied, or its batch failed.
	fail(err error)
}

// request is one op waiting for the writer, and its answer once its batch is done.
type request[T any] struct {
	op   op[T]
	res  T
	err  error
	done chan struct{}
}

func (p *request[T]) applyIn(ctx context.Context, b *batch) verdict {
	res, outcome, fatal := p.op.apply(ctx, b)
	p.res = res
	return b.endOp(ctx, verdict{outcome, fatal})
}

func (p *request[T]) answer(outcome error) {
	p.err = outcome
	close(p.done)
}

func (p *request[T]) fail(err error) {
	var zero T
	p.res, p.err = zero, err
	close(p.done)
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
	retain   time.Duration // how long a closed hold stays whole in memory (Config.Sweep.RetainClosed)
	in       chan pending
	onCommit func(b *batch)
	// onFail learns of a failed batch and returns the state reloaded from SQL (nil: the
	// region stops leading), since memory may be ahead of the database, and what every
	// request of the batch is told (Region.onBatchFailure: the one place that decides it).
	onFail func(err error) (m *memState, answer error)
	m      *memState
	aside  *asideBook
	// metrics learns of each committed batch and each coordinator request the sale's fence
	// refused (Config.Metrics).
	metrics Metrics

	writerLife
}

// writerLife is a writer's goroutine and the gate of its queue: stop ends the goroutine (wg),
// and close shuts the gate once it has.
type writerLife struct {
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	gate     sync.RWMutex // held shared while queuing an op, exclusively by close
	shut     bool         // under gate: the queue takes no more ops
}

func (w *writer) start() {
	if w.metrics == nil {
		w.metrics = noMetrics{}
	}
	w.stop = make(chan struct{})
	w.wg.Add(1)
	go w.run()
}

// close stops the writer and fails every request still queued. Idempotent.
func (w *writer) close() {
	w.stopOnce.Do(func() { close(w.stop) })
	w.wg.Wait()
	// An op may have entered the queue after the writer's own last drain; none can once the
	// gate is shut, so this drain is the last.
	w.gate.Lock()
	w.shut = true
	w.gate.Unlock()
	w.failQueued()
}

// submit queues o on w and waits for its batch to commit. A canceled ctx after queuing leaves
// the outcome unknown: the caller must ask again with the same key.
func submit[T any](ctx context.Context, w *writer, o op[T]) (T, error) {
	return submitThen(ctx, w, o, func() {})
}

// submitThen is submit with finished called exactly once when the op can no longer take
// effect: answered, or never applied. When ctx ends first, the caller is answered at once
// (outcome unknown) and finished runs later, once the op is done.
//
// Every op that enqueue accepted is answered: by its batch, or by failQueued once the writer
// stopped (close runs it after shutting the gate). So the wait needs no stop case, and the
// hot path selects over two channels, not three.
func submitThen[T any](ctx context.Context, w *writer, o op[T], finished func()) (T, error) {
	var zero T
	p := &request[T]{op: o, done: make(chan struct{})}
	if err := w.enqueue(ctx, p); err != nil {
		finished()
		return zero, err
	}
	select {
	case <-p.done:
		finished()
		return p.res, p.err
	case <-ctx.Done():
		go func() {
			<-p.done
			finished()
		}()
		return zero, fmt.Errorf("%w (%v)", ErrUnknownOutcome, ctx.Err())
	}
}

// enqueue queues p unless the writer is stopped, ctx has ended or the queue is full
// (Config.Writer.MaxQueue: OVERLOADED, with a retry-after; nothing was done). The gate is held
// shared while sending, so that once close holds it exclusively no op can enter the queue
// after its last drain.
func (w *writer) enqueue(ctx context.Context, p pending) error {
	w.gate.RLock()
	defer w.gate.RUnlock()
	if w.shut {
		return fmt.Errorf("region writer stopped: %w", ErrNotLeader)
	}
	if err := ctx.Err(); err != nil {
		return err // the caller has gone: do nothing for it
	}
	select {
	case w.in <- p:
		return nil
	default: // full: say so at once, rather than hold the caller (and its memory) in a line
		return &apierr.OverloadedError{What: "the region's writer queue", RetryAfter: queueRetryAfter}
	}
}

// queueRetryAfter is the retry-after a full writer queue answers with: about the time the
// writer takes to commit a few batches.
const queueRetryAfter = 50 * time.Millisecond

func (w *writer) run() {
	defer w.wg.Done()
	for {
		var first pending
		select {
		case <-w.stop: // checked first: once stopped, take no new batch
			w.failQueued()
			return
		default:
		}
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
func (w *writer) collect(first pending) []pending {
	ps := []pending{first}
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

func (w *writer) commit(ps []pending) {
	if w.m == nil {
		w.failAll(ps, fmt.Errorf("region state not loaded: %w", ErrNotLeader))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	// The database keeps microseconds: decide at the stored precision, so the hold a request
	// is answered with is the hold a read or a replay returns, and a deadline compares the
	// same before and after it was stored.
	b := &batch{now: w.clock.Now().Truncate(time.Microsecond), touched: map[poolKey]transfer.Units{}, sales: map[string]SaleTerms{},
		m: w.m, w: newWrites(), db: w.pool, epoch: w.epoch, stamp: w.m.changed + 1, overlay: map[string]*memHold{}, keys: map[keyKey]*memHold{},
		aside: w.aside, asideDelta: map[poolKey]transfer.Units{}}
	outcomes := make([]error, len(ps))
	err := func() error {
		for i, p := range ps {
			v := p.applyIn(ctx, b)
			if v.fatal != nil {
				return v.fatal
			}
			if v.outcome != nil && errors.Is(v.outcome, ErrFenced) {
				w.metrics.Fenced(FenceGeneration)
			}
			outcomes[i] = v.outcome
		}
		if b.tx == nil {
			return b.flushOnce(ctx) // the hot path: no op needed a transaction of its own
		}
		return b.flush(ctx)
	}()
	if err != nil && b.tx != nil {
		_ = b.tx.Rollback(ctx)
	}
	if err == nil && b.tx != nil {
		if cerr := b.tx.Commit(ctx); cerr != nil {
			err = fmt.Errorf("%w: commit: %v", ErrUnknownOutcome, cerr) // it may or may not have committed
		}
	}
	if err != nil {
		// Reload first: a client retrying at once must meet the state the database holds,
		// not the one this batch left in memory.
		w.m, err = w.onFail(err)
		w.failAll(ps, err)
		return
	}
	w.m.publish(b.overlay, b.now)
	w.m.dropArchivedAll(b.archived)
	w.m.changed = b.stamp
	w.m.retireClosed(b.now.Add(-w.retain))
	w.onCommit(b)
	w.metrics.BatchCommitted(len(ps), time.Since(start))
	for i, p := range ps {
		p.answer(outcomes[i])
	}
}

func (w *writer) failAll(ps []pending, err error) {
	for _, p := range ps {
		p.fail(err)
	}
}

func (w *writer) failQueued() {
	for {
		select {
		case p := <-w.in:
			p.fail(fmt.Errorf("region writer stopped: %w", ErrNotLeader))
		default:
			return
		}
	}
}
