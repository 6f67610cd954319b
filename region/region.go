package region

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/transfer"
)

// Config tunes one region. Zero values take the defaults documented on each field.
type Config struct {
	// Name is the region's name (us, eu, ...).
	Name string
	// Clock tells the time for holds and expiry; default the wall clock.
	Clock clock.Clock
	// MaxKeysPerUser is the most request keys one buyer may use in one sale at this region
	// (every reserve with a new key is one, kept for good); past it a reserve with a new key
	// is answered TOO_MANY_KEYS (RESOURCE_EXHAUSTED), so what a buyer makes the leader keep
	// is bounded. Retries with a used key are answered as before. Default 1,000.
	MaxKeysPerUser int32
	// StandbyRefresh is how often a process that does not lead refreshes its warm copy of
	// the region's state (KeepWarm), so that taking over reads only what changed since.
	// Default 1s; negative: no copy, a takeover loads every hold.
	StandbyRefresh time.Duration
	// Logger receives operational messages; default slog.Default().
	Logger *slog.Logger
	// Verify runs the expensive invariant checks after every batch (QUOTA_VERIFY=1).
	Verify bool
	// Metrics receives the region's counts (reservations by outcome, batches, fences) for
	// the process's Prometheus metrics; default: counted nowhere.
	Metrics Metrics
	// Writer tunes the leader's writer: its batches and its queue.
	Writer WriterConfig
	// Sweep tunes the sweeper: expiry of holds and the archiving of closed ones.
	Sweep SweepConfig
	// Binding binds buyers to this region in a sale without a waiting room (binding.go).
	Binding BindingConfig
	// Cluster is what the region reads of the rest of the cluster: its leader, the
	// coordinator's flags and generation, the ticket keys. Each unset function reads nothing.
	Cluster ClusterView
}

// WriterConfig tunes the leader's writer (Config.Writer).
type WriterConfig struct {
	// MaxBatch is the most operations one transaction commits; default 256.
	MaxBatch int
	// MaxQueue is the most operations waiting for the writer; past it a request is answered
	// OVERLOADED (RESOURCE_EXHAUSTED with a retry-after) at once. Default 16 × MaxBatch.
	MaxQueue int
	// BatchWindow is how long the writer waits for more operations after the first; 0 (the
	// default) commits whatever is queued at once, so light load pays about one commit.
	BatchWindow time.Duration
}

// SweepConfig tunes the sweeper (Config.Sweep).
type SweepConfig struct {
	// Interval is how often expired holds are looked for; default 1s.
	Interval time.Duration
	// Batch is the most holds one sweep expires per transaction; default 512.
	Batch int
	// RetainClosed is how long the leader keeps a closed (sold, released, expired) hold
	// whole in memory after it closed, so retries of it are answered without SQL; afterwards
	// it keeps only a digest of its key and reads the hold from SQL when asked, and the
	// sweeper moves the hold to the archive table holds_closed (archive.go). The time counts
	// from the hold's stored closed_at, also for the holds a leader loads. Default 10m.
	RetainClosed time.Duration
}

// BindingConfig binds buyers to this region (Config.Binding).
type BindingConfig struct {
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
	// InFlight bounds the reservations waiting for their buyer's binding write at once;
	// default 1024. fencing.Binder writes the binds waiting together in one etcd transaction
	// (up to fencing.MaxBindBatch), so this bounds a queue, not etcd's load.
	InFlight int
}

// ClusterView is what a region reads of the rest of the cluster (Config.Cluster).
type ClusterView struct {
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
	if c.Writer.MaxBatch == 0 {
		c.Writer.MaxBatch = 256
	}
	if c.Writer.MaxBatch < 1 || c.Writer.MaxBatch > 10000 {
		return fmt.Errorf("max batch %d: must be 1..10000", c.Writer.MaxBatch)
	}
	if c.MaxKeysPerUser == 0 {
		c.MaxKeysPerUser = DefaultMaxKeysPerUser
	}
	if c.MaxKeysPerUser < 1 {
		return fmt.Errorf("max keys per user %d: must be positive", c.MaxKeysPerUser)
	}
	if c.Writer.MaxQueue == 0 {
		c.Writer.MaxQueue = 16 * c.Writer.MaxBatch
	}
	if c.Writer.MaxQueue < c.Writer.MaxBatch || c.Writer.MaxQueue > 1<<20 {
		return fmt.Errorf("max queue %d: must be %d (max batch)..%d", c.Writer.MaxQueue, c.Writer.MaxBatch, 1<<20)
	}
	if c.Writer.BatchWindow < 0 || c.Writer.BatchWindow > time.Second {
		return fmt.Errorf("batch window %s: must be 0..1s", c.Writer.BatchWindow)
	}
	if c.Sweep.Interval == 0 {
		c.Sweep.Interval = time.Second
	}
	if c.Sweep.Interval < time.Millisecond {
		return fmt.Errorf("sweep interval %s: must be at least 1ms", c.Sweep.Interval)
	}
	if c.Sweep.Batch == 0 {
		c.Sweep.Batch = 512
	}
	if c.Sweep.Batch < 1 {
		return fmt.Errorf("sweep batch %d: must be positive", c.Sweep.Batch)
	}
	if c.Sweep.RetainClosed == 0 {
		c.Sweep.RetainClosed = DefaultRetainClosed
	}
	if c.Sweep.RetainClosed < 0 {
		return fmt.Errorf("retain closed %s: must not be negative", c.Sweep.RetainClosed)
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

// DefaultRetainClosed is Config.Sweep.RetainClosed's default: long enough for a client's
// retries of a confirm or release to be answered from memory, short enough that a busy
// sale's closed holds do not pile up in it.
const DefaultRetainClosed = 10 * time.Minute

type poolKey struct{ sale, sku string }

// Region serves one region's pools. It writes only while it leads (Lead with an epoch from
// the region's election); otherwise every change answers ErrNotLeader.
//
// It is made of parts that share its configuration and its database explicitly, each in a
// file of its own: leadership (leader.go: the terms of leadership under the epoch fence
// and the writer of each), warmCopy (standby.go: the warm standby's copy), readCache
// (cache.go: what requests read without the writer) and the sweeper (sweeper.go). The parts
// are embedded so that their exported methods (Lead, StepDown, KeepWarm, ...) are the
// region's; the request entry points, here and in the request files, use them.
type Region struct {
	cfg  Config
	pool *pgxpool.Pool

	*leadership
	*warmCopy
	*readCache
	sweeper sweeper

	// demand counts the units buyers asked for, for the rebalancer (demand.go; its own lock,
	// taken alone).
	demand demandBook
	// aside is what the pools set aside for their waitlists (aside.go).
	aside *asideBook
	// coordGen is the highest coordinator leader generation read from etcd so far.
	coordGen atomic.Int64
	// binds is what this region knows of its buyers' bindings (binding.go); nil when it binds
	// no one (Config.Binding.Bind unset).
	binds *bindings
}

// New builds a region on pool, whose schema must be migrated (Migrate).
func New(cfg Config, pool *pgxpool.Pool) (*Region, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Region{cfg: cfg, pool: pool, aside: newAsideBook(), binds: newBindings(cfg)}
	r.readCache = newReadCache(&r.cfg, pool)
	r.warmCopy = newWarmCopy(&r.cfg, pool)
	r.sweeper = sweeper{cfg: &r.cfg, pool: pool}
	r.leadership = &leadership{cfg: &r.cfg, pool: pool, cache: r.readCache, standby: r.warmCopy, aside: r.aside,
		onCommit: r.applyCommitted, tasks: []func(context.Context, *writer){
			r.sweeper.sweep,
			func(ctx context.Context, _ *writer) { r.demand.flushEvery(ctx, &r.cfg, pool) },
		}}
	return r, nil
}

// Name is the region's name.
func (r *Region) Name() string { return r.cfg.Name }

// Close stops the region, and waits for a failed writer that is stepping itself down; a
// KeepWarm still running loads no copy from then on. It does not close the database pool,
// which the caller owns.
func (r *Region) Close() {
	r.warmCopy.closeWarm()
	r.leadership.StepDown()
	r.selfStops.Wait()
}

// applyCommitted runs on the writer after a commit: the cache learns what is now durable.
func (r *Region) applyCommitted(b *batch) {
	r.readCache.learn(b)
	for k, d := range b.asideDelta {
		r.aside.add(k, d)
	}
	for k, a := range b.touched { // a debit may have taken set-aside units: no more aside than there is
		r.aside.clamp(k, a)
	}
	if r.cfg.Verify {
		verifyCommitted(r.readCache, b)
	}
}

// newHoldID names a new hold: the region, then 6 bytes of the clock's milliseconds and 8
// random bytes, in hex. The time prefix makes a batch's ids land together at the right edge
// of the holds primary key (PostgreSQL's rightmost-leaf fast path) instead of on random
// leaves, each of which cost a page read, a full-page image in the WAL after a checkpoint,
// and splits all over the index; the random part keeps ids unique and unguessable.
func newHoldID(cfg *Config) string {
	var b [14]byte
	ms := uint64(cfg.Clock.Now().UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	if _, err := rand.Read(b[6:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // the OS random source failing is not recoverable
	}
	return cfg.Name + "." + hex.EncodeToString(b[:])
}
