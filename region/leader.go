package region

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
)

// leadership is the region's terms of leadership: taking over under an epoch (Lead), the
// writer of the current term and the background tasks that run with it, reloading after a
// failed batch, and stepping down. It shares the database and the configuration with the
// region's other parts, fills the read cache (cache) on each takeover and reload and empties
// it on stepping down, and takes the warm standby's copy (standby) at takeover.
//
// Locks, in the only order in which one is taken while another is held: leadMu (a change of
// leadership, held for a whole Lead or StepDown), then the standby's warmSem (held for a
// whole refresh or takeover), then the leaf locks, none of which is held while taking any
// other: mu (the writer and its cancel), the standby's warmMu, the cache's availMu and
// inWriterMu, and the memState's own mu (its committed holds). The writer's gate (writer.go)
// is taken under none of them but leadMu. The wait groups: wg for the term's tasks,
// selfStops for failed writers stepping down; Close waits for both.
type leadership struct {
	cfg     *Config
	pool    *pgxpool.Pool
	cache   *readCache
	standby *warmCopy
	aside   *asideBook
	// onCommit runs on the writer after each commit (Region.applyCommitted); tasks run, each
	// on a goroutine of its own, for as long as a term lasts (the sweeper, the demand flush).
	onCommit func(b *batch)
	tasks    []func(ctx context.Context, w *writer)

	// leadMu orders changes of leadership (Lead, StepDown, a failed writer stepping down);
	// mu guards only the fields below, so a request during a slow Lead answers NOT_LEADER at
	// once instead of waiting for it.
	leadMu  sync.Mutex
	mu      sync.Mutex
	w       *writer
	cancel  context.CancelFunc
	stopped chan struct{}
	wg      sync.WaitGroup
	// selfStops counts failed writers stepping themselves down, so Close can wait for them.
	selfStops sync.WaitGroup
	stats     leaderStats
}

// leaderStats counts what happened to this process's terms.
type leaderStats struct {
	// fullTakeovers and warmTakeovers count the takeovers that loaded every hold and those
	// that caught up a warm copy.
	fullTakeovers, warmTakeovers atomic.Int64
	// batchFailures counts the writer's batches that failed (each forces a reload).
	batchFailures atomic.Int64
}

// Lead makes this process the region's writer under epoch. It first raises the stored epoch
// (so a previous leader's batches commit nothing from then on: I4), then loads the state it
// decides from (its warm copy caught up, or every hold: loadForTakeover), then serves. epoch
// must come from the region's election.
func (r *leadership) Lead(ctx context.Context, epoch int64) error {
	r.leadMu.Lock()
	defer r.leadMu.Unlock()
	if r.Leading() {
		return errors.New("region: already leading")
	}
	if err := r.raiseEpoch(ctx, epoch); err != nil {
		return err
	}
	start := time.Now()
	m, how, err := r.reloadWith(ctx, epoch, r.standby.loadForTakeover)
	if err != nil {
		r.standby.resumeWarm()
		return err
	}
	if how == "warm" {
		r.stats.warmTakeovers.Add(1)
	} else {
		r.stats.fullTakeovers.Add(1)
	}
	r.aside.reset() // the waitlists were the last leader's memory (aside.go)
	w := &writer{
		pool: r.pool, clock: r.cfg.Clock, epoch: epoch, max: r.cfg.Writer.MaxBatch, window: r.cfg.Writer.BatchWindow, retain: r.cfg.Sweep.RetainClosed,
		in: make(chan pending, r.cfg.Writer.MaxQueue), onCommit: r.onCommit, m: m, aside: r.aside, metrics: r.cfg.Metrics,
	}
	w.onFail = func(err error) (*memState, error) { return r.onBatchFailure(w, err) }
	w.start()
	sctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	r.w, r.cancel, r.stopped = w, cancel, make(chan struct{})
	r.mu.Unlock()
	holds := len(m.holds)
	r.wg.Add(1 + len(r.tasks))
	go func() {
		defer r.wg.Done()
		warnNearMemoryLimit(r.cfg, holds) // off the takeover's path: measuring the live heap may take a collection
	}()
	for _, task := range r.tasks {
		go func() {
			defer r.wg.Done()
			task(sctx, w)
		}()
	}
	r.cfg.Logger.Info("region leading", "region", r.cfg.Name, "epoch", epoch, "load", how, "load_ms", time.Since(start).Milliseconds(), "holds", holds)
	return nil
}

// raiseEpoch raises the region's epoch (fencing.RaiseEpoch, I4). Whatever holds the epoch row
// past epochWait is a stalled transaction of an older leader: one paused or cut off in the
// middle of sending a pipelined batch, where the server's idle timer
// (fencing.MaxIdleHoldingFence) does not run. Its backend is ended, which rolls it back
// (nothing of it was acknowledged), and the raise is tried again, so a successor never waits
// for TCP to give up on a stalled predecessor.
func (r *leadership) raiseEpoch(ctx context.Context, epoch int64) error {
	for {
		err := pgutil.Tx(ctx, r.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", epochWait.Milliseconds())); err != nil {
				return err
			}
			return fencing.RaiseEpoch(ctx, tx, epoch)
		})
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55P03" { // lock_not_available: lock_timeout
			return err
		}
		if err := r.endEpochHolders(ctx); err != nil {
			return err
		}
	}
}

// endEpochHolders ends every other backend whose transaction has locked the epoch row to
// write or to share it (the writers' fences; plain reads do not count).
func (r *leadership) endEpochHolders(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, `SELECT DISTINCT l.pid, a.backend_start FROM pg_locks l
		JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.relation = 'leader_epoch'::regclass AND l.granted
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND l.mode IN ('RowShareLock', 'RowExclusiveLock') AND l.pid <> pg_backend_pid()
			AND a.backend_start IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("look for the epoch row's holders: %w", err)
	}
	type holder struct {
		PID     int32
		Started time.Time
	}
	holders, err := pgx.CollectRows(rows, pgx.RowToStructByPos[holder])
	if err != nil {
		return fmt.Errorf("look for the epoch row's holders: %w", err)
	}
	for _, h := range holders {
		r.cfg.Logger.Warn("ending a stalled transaction of an older leader that holds the epoch row",
			"region", r.cfg.Name, "backend", h.PID, "waited", epochWait)
		if err := endBackendStarted(ctx, r.pool, uint32(h.PID), h.Started); err != nil {
			return err
		}
	}
	return nil
}

// StepDown stops writing: queued and later changes answer ErrNotLeader. Idempotent.
func (r *leadership) StepDown() { r.stepDownFrom(nil) }

// stepDownFrom stops the writer w (any writer when w is nil): a failed writer steps itself
// down without touching a newer term that has started since.
func (r *leadership) stepDownFrom(only *writer) {
	r.leadMu.Lock()
	defer r.leadMu.Unlock()
	r.mu.Lock()
	w, cancel, stopped := r.w, r.cancel, r.stopped
	if w == nil || (only != nil && only != w) {
		r.mu.Unlock()
		return
	}
	r.w, r.cancel, r.stopped = nil, nil, nil
	r.mu.Unlock()
	cancel()
	r.wg.Wait()
	w.close()
	r.cache.forget() // this state is no longer kept up to date: let it go before a standby's copy loads
	r.standby.resumeWarm()
	close(stopped)
	r.cfg.Logger.Info("region stepped down", "region", r.cfg.Name)
}

// Stopped is closed when the current term of leadership ends, whoever ended it (a fence, a
// failed reload, StepDown). The process holding the region's etcd lease must then resign,
// so a standby can take over. When not leading it is already closed.
func (r *leadership) Stopped() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return r.stopped
}

// BatchFailures counts the writer's batches that failed, each of which made the leader
// reload its memory from SQL (or step down).
func (r *leadership) BatchFailures() int64 { return r.stats.batchFailures.Load() }

// Takeovers counts this process's takeovers: those that loaded every hold, and those that
// caught up the warm copy it kept as a standby (KeepWarm).
func (r *leadership) Takeovers() (full, warm int64) {
	return r.stats.fullTakeovers.Load(), r.stats.warmTakeovers.Load()
}

// Leading reports whether this process is the region's writer right now.
func (r *leadership) Leading() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.w != nil
}

// term answers the current term's epoch, and whether this process leads.
func (r *leadership) term() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w == nil {
		return 0, false
	}
	return r.w.epoch, true
}

// writer is the current term's writer, or NOT_LEADER.
func (r *leadership) writer() (*writer, error) {
	r.mu.Lock()
	w := r.w
	r.mu.Unlock()
	if w != nil {
		return w, nil
	}
	return nil, r.notLeader()
}

// notLeader is ErrNotLeader with the leader's address when the election knows it.
func (r *leadership) notLeader() error {
	nl := &apierr.NotLeaderError{Role: "region " + r.cfg.Name}
	if r.cfg.Cluster.LeaderHint != nil {
		nl.Leader = r.cfg.Cluster.LeaderHint()
	}
	return nl
}

// submitOp submits o to the current term's writer and returns its result (NOT_LEADER when
// this process does not lead).
func submitOp[T any](ctx context.Context, r *leadership, o op[T]) (T, error) {
	w, err := r.writer()
	if err != nil {
		var zero T
		return zero, err
	}
	return submit(ctx, w, o)
}

// reload reads the region's state from SQL into a fresh memState and republishes the
// caches readers use without the writer. It first waits out any transaction of this writer
// still in doubt (a COMMIT whose reply was lost holds the epoch row until it ends), so the
// snapshot includes it, and it fails with ErrFenced when a newer leader has taken over.
func (r *leadership) reload(ctx context.Context, epoch int64) (*memState, error) {
	m, _, err := r.reloadWith(ctx, epoch, func(ctx context.Context) (*memState, string, error) {
		m, err := loadMem(ctx, r.pool, r.cfg.Name, r.cfg.Clock.Now(), r.cfg.Sweep.RetainClosed)
		return m, "full", err
	})
	return m, err
}

// reloadWith is reload with the state read by load, which also says how it read it.
func (r *leadership) reloadWith(ctx context.Context, epoch int64, load func(context.Context) (*memState, string, error)) (*memState, string, error) {
	if err := pgutil.Tx(ctx, r.pool, func(tx pgx.Tx) error { return fencing.CheckEpoch(ctx, tx, epoch) }); err != nil {
		return nil, "", err
	}
	m, how, err := load(ctx)
	if err != nil {
		return nil, "", err
	}
	r.cache.publish(m)
	return m, how, nil
}

// onBatchFailure runs on the writer after a failed batch, and is the one place that decides
// what the batch's requests are told. It first forgets the cache (it may be ahead of the
// database) and reloads it, or, fenced or unable to reload, steps down (recoverFrom); then
// every request of the batch gets the same answer (batchAnswer).
func (r *leadership) onBatchFailure(w *writer, err error) (*memState, error) {
	r.stats.batchFailures.Add(1)
	m, reloadErr := r.recoverFrom(w, err)
	fenced := m == nil && errors.Is(reloadErr, ErrFenced)
	if fenced || errors.Is(err, ErrFenced) {
		r.cfg.Metrics.Fenced(FenceEpoch)
	}
	return m, r.batchAnswer(err, fenced)
}

// batchAnswer is what every request of a failed batch is told (I6: none is told it
// succeeded):
//   - UNKNOWN_OUTCOME when the commit may have happened (its reply was lost, or a
//     one-round-trip batch's backend was orphaned): ask again with the same key or id;
//   - NOT_LEADER, with where the leader is, when a newer leader has taken over and the batch
//     surely committed nothing (it met the epoch fence itself, as only that fence fails a
//     whole batch, or it failed before its commit and the reload met the fence);
//   - ABORTED otherwise: surely not committed, so it may be asked again as it was.
func (r *leadership) batchAnswer(batchErr error, fencedNow bool) error {
	switch {
	case errors.Is(batchErr, ErrUnknownOutcome):
		return batchErr
	case errors.Is(batchErr, ErrFenced) || fencedNow:
		r.cfg.Logger.Info("region batch fenced by a newer leader", "region", r.cfg.Name, "err", batchErr)
		return r.notLeader()
	default:
		return fmt.Errorf("%w: %w", ErrAborted, batchErr)
	}
}

// recoverFrom reloads the leader's memory after a failed batch, or steps down when it is
// fenced or cannot reload; it returns the reloaded state (nil: stepping down) and why it
// could not reload.
func (r *leadership) recoverFrom(w *writer, err error) (*memState, error) {
	r.cfg.Logger.Warn("region batch failed", "region", r.cfg.Name, "err", err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var m *memState
	var orphan *orphanError
	switch {
	case errors.Is(err, ErrFenced): // a newer leader took over: stop
	case errors.As(err, &orphan):
		// Its pipeline may not have reached the epoch row yet, so reload's CheckEpoch would
		// not wait for it: end its backend first, or stop leading.
		if err = orphan.end(ctx, r.pool); err == nil {
			m, err = r.reload(ctx, w.epoch)
		}
	default:
		m, err = r.reload(ctx, w.epoch)
	}
	if m == nil {
		r.cfg.Logger.Error("region cannot go on leading; stepping down", "region", r.cfg.Name, "err", err)
		r.cache.forget()
		r.selfStop(w)
		return nil, err
	}
	return m, nil
}

// selfStop steps the writer w's term down on a goroutine of its own (the step down waits for
// the writer's goroutine, which may be the caller), counted in selfStops.
func (r *leadership) selfStop(w *writer) {
	r.selfStops.Add(1)
	go func() {
		defer r.selfStops.Done()
		r.stepDownFrom(w)
	}()
}

// stepDownTerm steps down if the current term is epoch's: a part of the leader's memory kept
// beside the writer's (the front door's line) may disagree with the database, and only a new
// term, loading behind the epoch fence, makes them agree again.
func (r *leadership) stepDownTerm(epoch int64) {
	r.mu.Lock()
	w := r.w
	r.mu.Unlock()
	if w == nil || w.epoch != epoch {
		return
	}
	r.cfg.Logger.Error("region cannot go on leading: its waiting line may disagree with the database; stepping down",
		"region", r.cfg.Name, "epoch", epoch)
	r.selfStop(w)
}

// epochWait is how long a new leader waits for the epoch row before it ends the
// transactions that hold it (raiseEpoch). A healthy batch holds it for milliseconds.
const epochWait = 2 * time.Second
