package region

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// Config tunes one region. Zero values take the defaults documented on each field.
type Config struct {
	// Name is the region's name (us, eu, ...).
	Name string
	// Clock tells the time for holds and expiry; default the wall clock.
	Clock clock.Clock
	// MaxBatch is the most operations one transaction commits; default 256.
	MaxBatch int
	// MaxKeysPerUser is the most request keys one buyer may use in one sale at this region
	// (every reserve with a new key is one, kept for good); past it a reserve with a new key
	// is answered TOO_MANY_KEYS (RESOURCE_EXHAUSTED), so what a buyer makes the leader keep
	// is bounded. Retries with a used key are answered as before. Default 1,000.
	MaxKeysPerUser int32
	// MaxQueue is the most operations waiting for the writer; past it a request is answered
	// OVERLOADED (RESOURCE_EXHAUSTED with a retry-after) at once. Default 16 × MaxBatch.
	MaxQueue int
	// BatchWindow is how long the writer waits for more operations after the first; 0 (the
	// default) commits whatever is queued at once, so light load pays about one commit.
	BatchWindow time.Duration
	// SweepInterval is how often expired holds are looked for; default 1s.
	SweepInterval time.Duration
	// SweepBatch is the most holds one sweep expires per transaction; default 512.
	SweepBatch int
	// RetainClosed is how long the leader keeps a closed (sold, released, expired) hold
	// whole in memory after it closed, so retries of it are answered without SQL; afterwards
	// it keeps only a digest of its key and reads the hold from SQL when asked, and the
	// sweeper moves the hold to the archive table holds_closed (archive.go). The time counts
	// from the hold's stored closed_at, also for the holds a leader loads. Default 10m.
	RetainClosed time.Duration
	// StandbyRefresh is how often a process that does not lead refreshes its warm copy of
	// the region's state (KeepWarm), so that taking over reads only what changed since.
	// Default 1s; negative: no copy, a takeover loads every hold.
	StandbyRefresh time.Duration
	// Logger receives operational messages; default slog.Default().
	Logger *slog.Logger
	// Verify runs the expensive invariant checks after every batch (QUOTA_VERIFY=1).
	Verify bool
	// LeaderHint, when set, tells where the region's current leader answers; a standby puts
	// it in its NOT_LEADER answers so clients can go there.
	LeaderHint func() string
	// SoldOut, when set, tells whether the coordinator has flagged a SKU as gone everywhere;
	// an empty pool then answers SOLD_OUT instead of REGION_EXHAUSTED.
	SoldOut func(sale, sku string) bool
	// Drained, when set, tells whether the coordinator has flagged a SKU as having no unit
	// available anywhere (some may be held): waiting rooms close with SOLD_OUT and buyers
	// may join its waitlist. Unset: SoldOut stands in for it.
	Drained func(sale, sku string) bool
	// CoordinatorGeneration, when set, reads the coordinator leader's generation from etcd.
	// A coordinator request whose generation is above it is refused and raises no fence
	// (I4: a fence rises only to a real leader's generation). Unset (tests, the
	// simulation): no bound.
	CoordinatorGeneration func(ctx context.Context) (int64, error)
	// Tickets, when set, returns the cluster's ticket keys as last read (the key file can
	// change under a running region: keys rotate). A sale with a waiting room needs them:
	// without them every reservation of it is refused TICKET_INVALID.
	Tickets func() *admission.Keyring
	// Metrics receives the region's counts (reservations by outcome, batches, fences) for
	// the process's Prometheus metrics; default: counted nowhere.
	Metrics Metrics
	// Bind records, once per (sale, user) across the cluster, the region a buyer is bound to,
	// and returns the region recorded: this one, or the one that came first
	// (fencing.Binder.Bind). In a sale without a waiting room a buyer's first reservation here
	// binds them before it is decided (binding.go; a sale with one binds at admission,
	// DoorConfig.Bind), so the per-user limit holds across regions. Nil: no binding (a
	// cluster of one region).
	Bind func(ctx context.Context, sale, user, region string) (string, error)
	// MaxBindings bounds the bindings the region remembers, so that only a buyer's first
	// reservation here reaches etcd; one forgotten costs one more etcd transaction at the
	// buyer's next reservation. Default 200,000.
	MaxBindings int
	// BindsInFlight bounds the reservations waiting for their buyer's binding write at once;
	// default 1024. fencing.Binder writes the binds waiting together in one etcd transaction
	// (up to fencing.MaxBindBatch), so this bounds a queue, not etcd's load.
	BindsInFlight int
}

// DefaultMaxKeysPerUser is Config.MaxKeysPerUser's default.
const DefaultMaxKeysPerUser int32 = 1000

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if r := transfer.CheckRegion(c.Name); r != "" {
		return fmt.Errorf("region name %q: %s", c.Name, r)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 256
	}
	if c.MaxBatch < 1 || c.MaxBatch > 10000 {
		return fmt.Errorf("max batch %d: must be 1..10000", c.MaxBatch)
	}
	if c.MaxKeysPerUser == 0 {
		c.MaxKeysPerUser = DefaultMaxKeysPerUser
	}
	if c.MaxKeysPerUser < 1 {
		return fmt.Errorf("max keys per user %d: must be positive", c.MaxKeysPerUser)
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = 16 * c.MaxBatch
	}
	if c.MaxQueue < c.MaxBatch || c.MaxQueue > 1<<20 {
		return fmt.Errorf("max queue %d: must be %d (max batch)..%d", c.MaxQueue, c.MaxBatch, 1<<20)
	}
	if c.BatchWindow < 0 || c.BatchWindow > time.Second {
		return fmt.Errorf("batch window %s: must be 0..1s", c.BatchWindow)
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Second
	}
	if c.SweepInterval < time.Millisecond {
		return fmt.Errorf("sweep interval %s: must be at least 1ms", c.SweepInterval)
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = 512
	}
	if c.SweepBatch < 1 {
		return fmt.Errorf("sweep batch %d: must be positive", c.SweepBatch)
	}
	if c.RetainClosed == 0 {
		c.RetainClosed = DefaultRetainClosed
	}
	if c.RetainClosed < 0 {
		return fmt.Errorf("retain closed %s: must not be negative", c.RetainClosed)
	}
	if c.StandbyRefresh == 0 {
		c.StandbyRefresh = time.Second
	}
	if c.StandbyRefresh > 0 && c.StandbyRefresh < time.Millisecond {
		return fmt.Errorf("standby refresh %s: must be at least 1ms, or negative for none", c.StandbyRefresh)
	}
	if err := c.validateBinding(); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	return nil
}

// DefaultRetainClosed is Config.RetainClosed's default: long enough for a client's retries
// of a confirm or release to be answered from memory, short enough that a busy sale's closed
// holds do not pile up in it.
const DefaultRetainClosed = 10 * time.Minute

type poolKey struct{ sale, sku string }

// Region serves one region's pools. It writes only while it leads (Lead with an epoch from
// the region's election); otherwise every change answers ErrNotLeader.
//
// Locks, in the only order in which one is taken while another is held: leadMu (a change of
// leadership, held for a whole Lead or StepDown), then warmSem (a standby's copy, held for a
// whole refresh or takeover), then the leaf locks, none of which is held while taking any
// other: mu (the writer and its cancel), warmMu, availMu, inWriterMu, and the memState's own
// mu (its committed holds). The writer's gate (writer.go) is taken under none of them but
// leadMu. The wait groups: wg for the leader's sweeper, selfStops for failed writers stepping
// down; Close waits for both.
type Region struct {
	cfg  Config
	pool *pgxpool.Pool

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

	// demand counts the units buyers asked for, for the rebalancer (demand.go; its own lock,
	// taken alone).
	demand demandBook

	sales sync.Map // sale id → SaleTerms
	// soldOut holds the SOLD_OUT answer of each SKU flagged gone (exhausted), made once:
	// every later buyer of the SKU gets the same error.
	soldOut soldOutErrors
	availMu sync.RWMutex
	avail   map[poolKey]*atomic.Int64

	// state is the leader's memory (its committed holds by key are readable from any
	// goroutine), and inWriterKeys counts the reserves of each key on their way through the
	// writer: together they let an empty pool answer without the writer and, but for a key
	// whose hold has left memory (archive.go), without SQL.
	state        atomic.Pointer[memState]
	inWriterMu   sync.Mutex
	inWriterKeys map[keyKey]int

	// warm is a standby's copy of the state (standby.go). It belongs to whoever holds
	// warmSem, a one-slot semaphore held for a whole refresh (a channel, so a takeover can
	// give up waiting with its context). warmMu guards warmPaused, set while this process
	// leads, warmClosed, set by Close, and warmCancel, which cancels the refresh under way.
	warmSem    chan struct{}
	warm       *memState
	warmMu     sync.Mutex
	warmPaused bool
	warmClosed bool
	warmCancel context.CancelFunc
	// fullTakeovers and warmTakeovers count the takeovers that loaded every hold and those
	// that caught up a warm copy.
	fullTakeovers, warmTakeovers atomic.Int64
	// batchFailures counts the writer's batches that failed (each forces a reload).
	batchFailures atomic.Int64
	// aside is what the pools set aside for their waitlists (aside.go).
	aside *asideBook
	// coordGen is the highest coordinator leader generation read from etcd so far.
	coordGen atomic.Int64
	// paused is the leader's committed pauses (pause.go), for the answers given without the
	// writer (an empty pool's); nil when not leading.
	paused atomic.Pointer[pauseSet]
	// binds is what this region knows of its buyers' bindings (binding.go); nil when it binds
	// no one (Config.Bind unset).
	binds *bindings
}

// New builds a region on pool, whose schema must be migrated (Migrate).
func New(cfg Config, pool *pgxpool.Pool) (*Region, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Region{cfg: cfg, pool: pool, avail: map[poolKey]*atomic.Int64{}, inWriterKeys: map[keyKey]int{}, warmSem: make(chan struct{}, 1),
		aside: newAsideBook(), binds: newBindings(cfg)}, nil
}

// Name is the region's name.
func (r *Region) Name() string { return r.cfg.Name }

// Lead makes this process the region's writer under epoch. It first raises the stored epoch
// (so a previous leader's batches commit nothing from then on: I4), then loads the state it
// decides from (its warm copy caught up, or every hold: loadForTakeover), then serves. epoch
// must come from the region's election.
func (r *Region) Lead(ctx context.Context, epoch int64) error {
	r.leadMu.Lock()
	defer r.leadMu.Unlock()
	if r.Leading() {
		return errors.New("region: already leading")
	}
	if err := r.raiseEpoch(ctx, epoch); err != nil {
		return err
	}
	start := time.Now()
	m, how, err := r.reloadWith(ctx, epoch, r.loadForTakeover)
	if err != nil {
		r.resumeWarm()
		return err
	}
	if how == "warm" {
		r.warmTakeovers.Add(1)
	} else {
		r.fullTakeovers.Add(1)
	}
	r.aside.reset() // the waitlists were the last leader's memory (aside.go)
	w := &writer{
		pool: r.pool, clock: r.cfg.Clock, epoch: epoch, max: r.cfg.MaxBatch, window: r.cfg.BatchWindow, retain: r.cfg.RetainClosed,
		in: make(chan *request, r.cfg.MaxQueue), onCommit: r.applyCommitted, m: m, aside: r.aside, metrics: r.cfg.Metrics,
	}
	w.onFail = func(err error) (*memState, error) { return r.onBatchFailure(w, err) }
	w.start()
	sctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	r.w, r.cancel, r.stopped = w, cancel, make(chan struct{})
	r.mu.Unlock()
	r.wg.Add(2)
	go r.flushDemand(sctx)
	holds := len(m.holds)
	go func() {
		// Off the takeover's path: measuring the live heap may take a collection.
		r.warnNearMemoryLimit(holds)
		r.sweep(sctx, w)
	}()
	r.cfg.Logger.Info("region leading", "region", r.cfg.Name, "epoch", epoch, "load", how, "load_ms", time.Since(start).Milliseconds(), "holds", holds)
	return nil
}

// epochWait is how long a new leader waits for the epoch row before it ends the
// transactions that hold it (raiseEpoch). A healthy batch holds it for milliseconds.
const epochWait = 2 * time.Second

// raiseEpoch raises the region's epoch (fencing.RaiseEpoch, I4). Whatever holds the epoch row
// past epochWait is a stalled transaction of an older leader: one paused or cut off in the
// middle of sending a pipelined batch, where the server's idle timer
// (fencing.MaxIdleHoldingFence) does not run. Its backend is ended, which rolls it back
// (nothing of it was acknowledged), and the raise is tried again, so a successor never waits
// for TCP to give up on a stalled predecessor.
func (r *Region) raiseEpoch(ctx context.Context, epoch int64) error {
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
func (r *Region) endEpochHolders(ctx context.Context) error {
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
func (r *Region) StepDown() { r.stepDownFrom(nil) }

// stepDownFrom stops the writer w (any writer when w is nil): a failed writer steps itself
// down without touching a newer term that has started since.
func (r *Region) stepDownFrom(only *writer) {
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
	r.forget() // this state is no longer kept up to date: let it go before a standby's copy loads
	r.resumeWarm()
	close(stopped)
	r.cfg.Logger.Info("region stepped down", "region", r.cfg.Name)
}

// Stopped is closed when the current term of leadership ends, whoever ended it (a fence, a
// failed reload, StepDown). The process holding the region's etcd lease must then resign,
// so a standby can take over. When not leading it is already closed.
func (r *Region) Stopped() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return r.stopped
}

// Close stops the region, and waits for a failed writer that is stepping itself down; a
// KeepWarm still running loads no copy from then on. It does not close the database pool,
// which the caller owns.
func (r *Region) Close() {
	r.closeWarm()
	r.StepDown()
	r.selfStops.Wait()
}

// BatchFailures counts the writer's batches that failed, each of which made the leader
// reload its memory from SQL (or step down).
func (r *Region) BatchFailures() int64 { return r.batchFailures.Load() }

// Takeovers counts this process's takeovers: those that loaded every hold, and those that
// caught up the warm copy it kept as a standby (KeepWarm).
func (r *Region) Takeovers() (full, warm int64) {
	return r.fullTakeovers.Load(), r.warmTakeovers.Load()
}

// Leading reports whether this process is the region's writer right now.
func (r *Region) Leading() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.w != nil
}

func (r *Region) writer() (*writer, error) {
	r.mu.Lock()
	w := r.w
	r.mu.Unlock()
	if w != nil {
		return w, nil
	}
	return nil, r.notLeader()
}

// notLeader is ErrNotLeader with the leader's address when the election knows it.
func (r *Region) notLeader() error {
	nl := &apierr.NotLeaderError{Role: "region " + r.cfg.Name}
	if r.cfg.LeaderHint != nil {
		nl.Leader = r.cfg.LeaderHint()
	}
	return nl
}

func (r *Region) submit(ctx context.Context, o op) (any, error) {
	w, err := r.writer()
	if err != nil {
		return nil, err
	}
	return w.submit(ctx, o)
}

// submitAs submits o and returns its result as T (the type every op of its kind returns).
func submitAs[T any](ctx context.Context, r *Region, o op) (T, error) {
	var zero T
	res, err := r.submit(ctx, o)
	if err != nil {
		return zero, err
	}
	return res.(T), nil
}

// reload reads the region's state from SQL into a fresh memState and republishes the
// caches readers use without the writer. It first waits out any transaction of this writer
// still in doubt (a COMMIT whose reply was lost holds the epoch row until it ends), so the
// snapshot includes it, and it fails with ErrFenced when a newer leader has taken over.
func (r *Region) reload(ctx context.Context, epoch int64) (*memState, error) {
	m, _, err := r.reloadWith(ctx, epoch, func(ctx context.Context) (*memState, string, error) {
		m, err := loadMem(ctx, r.pool, r.cfg.Name, r.cfg.Clock.Now(), r.cfg.RetainClosed)
		return m, "full", err
	})
	return m, err
}

// reloadWith is reload with the state read by load, which also says how it read it.
func (r *Region) reloadWith(ctx context.Context, epoch int64, load func(context.Context) (*memState, string, error)) (*memState, string, error) {
	if err := pgutil.Tx(ctx, r.pool, func(tx pgx.Tx) error { return fencing.CheckEpoch(ctx, tx, epoch) }); err != nil {
		return nil, "", err
	}
	m, how, err := load(ctx)
	if err != nil {
		return nil, "", err
	}
	fresh := make(map[poolKey]*atomic.Int64, len(m.pools))
	for k, p := range m.pools {
		v := &atomic.Int64{}
		v.Store(int64(p.available))
		fresh[k] = v
	}
	r.state.Store(m) // holds before availability: an empty-pool answer never pairs new counts with old holds
	r.availMu.Lock()
	r.avail = fresh
	r.availMu.Unlock()
	r.sales.Clear()
	r.paused.Store(m.paused)
	return m, how, nil
}

// warnNearMemoryLimit logs when the live heap right after a takeover comes near the process's Go
// memory limit (quotad --memory-limit): past the limit the collector would run almost all the
// time. The load does not end with a collection (load.go), so the live heap the last one
// measured may be from before the state grew. The heap's objects, uncollected garbage
// included, bound the live heap from above: only when they come near the limit does this
// collect, to measure the live heap itself, so a state far below the limit costs nothing;
// Lead runs it on the sweeper's goroutine, after the leader serves.
func (r *Region) warnNearMemoryLimit(holds int) {
	limit := gcconf.Current().MemoryLimit
	if limit == 0 {
		return
	}
	if _, near := heapNear("/memory/classes/heap/objects:bytes", limit); !near {
		return
	}
	runtime.GC()
	if live, near := heapNear("/gc/heap/live:bytes", limit); near {
		r.cfg.Logger.Warn("region state is near the process's memory limit: raise quotad --memory-limit",
			"region", r.cfg.Name, "live_heap_mib", live>>20, "memory_limit_mib", limit>>20, "holds", holds)
	}
}

// heapNear reads a runtime/metrics byte count and tells whether it passes
// memoryLimitWarnShare of limit.
func heapNear(metric string, limit int64) (uint64, bool) {
	s := []metrics.Sample{{Name: metric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	v := s[0].Value.Uint64()
	return v, float64(v) > memoryLimitWarnShare*float64(limit)
}

// memoryLimitWarnShare is the share of the memory limit a loaded state may take before the
// leader warns: the rest is room for the batches' garbage between collections.
const memoryLimitWarnShare = 0.7

// forget drops the caches that answer without the writer, so nothing is answered from a
// state that may be wrong: requests fall through to the writer (and NOT_LEADER).
func (r *Region) forget() {
	// Availability first: with the state gone but a count left, a retry of a reserve whose
	// hold exists would be told the pool is empty (the reverse of reload's order).
	r.availMu.Lock()
	r.avail = map[poolKey]*atomic.Int64{}
	r.availMu.Unlock()
	r.state.Store(nil)
	r.paused.Store(nil)
}

// applyCommitted runs on the writer after a commit: the cache learns what is now durable.
func (r *Region) applyCommitted(b *batch) {
	r.availMu.Lock()
	for k, a := range b.touched {
		v, ok := r.avail[k]
		if !ok {
			v = &atomic.Int64{}
			r.avail[k] = v
		}
		v.Store(int64(a))
	}
	r.availMu.Unlock()
	r.paused.Store(b.m.paused) // the pauses this batch committed, if it changed them
	for k, d := range b.asideDelta {
		r.aside.add(k, d)
	}
	for k, a := range b.touched { // a debit may have taken set-aside units: no more aside than there is
		r.aside.clamp(k, a)
	}
	for id, t := range b.sales {
		r.sales.Store(id, t)
	}
	if r.cfg.Verify {
		r.verifyCommitted(b)
	}
}

// onBatchFailure runs on the writer after a failed batch, and is the one place that decides
// what the batch's requests are told. It first forgets the cache (it may be ahead of the
// database) and reloads it, or, fenced or unable to reload, steps down (recoverFrom); then
// every request of the batch gets the same answer (batchAnswer).
func (r *Region) onBatchFailure(w *writer, err error) (*memState, error) {
	r.batchFailures.Add(1)
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
func (r *Region) batchAnswer(batchErr error, fencedNow bool) error {
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
func (r *Region) recoverFrom(w *writer, err error) (*memState, error) {
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
		r.forget()
		r.selfStops.Add(1)
		go func() { // it waits for this writer goroutine, so not inline
			defer r.selfStops.Done()
			r.stepDownFrom(w)
		}()
		return nil, err
	}
	return m, nil
}

// cachedAvailable returns the committed available count of a pool, and whether it is known.
func (r *Region) cachedAvailable(k poolKey) (transfer.Units, bool) {
	r.availMu.RLock()
	v, ok := r.avail[k]
	r.availMu.RUnlock()
	if !ok {
		return 0, false
	}
	return transfer.Units(v.Load()), true
}

// newHoldID names a new hold: the region, then 6 bytes of the clock's milliseconds and 8
// random bytes, in hex. The time prefix makes a batch's ids land together at the right edge
// of the holds primary key (PostgreSQL's rightmost-leaf fast path) instead of on random
// leaves, each of which cost a page read, a full-page image in the WAL after a checkpoint,
// and splits all over the index; the random part keeps ids unique and unguessable.
func (r *Region) newHoldID() string {
	var b [14]byte
	ms := uint64(r.cfg.Clock.Now().UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	if _, err := rand.Read(b[6:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // the OS random source failing is not recoverable
	}
	return r.cfg.Name + "." + hex.EncodeToString(b[:])
}
