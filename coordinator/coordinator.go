// Package coordinator owns the global ledger (sales, SKU totals, unallocated units and the
// transfer log), drives transfers from the unallocated pool to regions (allocation), and
// audits global conservation against every region's durable state.
package coordinator

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// Errors a caller can test with errors.Is.
var (
	ErrNotLeader     = apierr.ErrNotLeader
	ErrFenced        = apierr.ErrFenced
	ErrNotFound      = apierr.ErrNotFound
	ErrAlreadyExists = apierr.ErrAlreadyExists
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate applies the ledger schema's pending migrations, under the migration lock
// (pgutil.Migrator).
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...pgutil.MigrateOption) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	return pgutil.Migrate(ctx, pool, sub, nil, opts...)
}

// SaleTerms are a sale's rules as published to regions: the one definition,
// transfer.SaleTerms.
type SaleTerms = transfer.SaleTerms

// Participant is the coordinator's transport to one region: each call is idempotent and
// carries the coordinator's generation, which the region fences on (I4). Errors from the
// region come back as the apierr sentinels.
type Participant interface {
	PutSale(ctx context.Context, gen int64, t SaleTerms) error
	// Credit adds t's units at the destination once; it answers the destination's record.
	Credit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error)
	// Refuse tombstones t at the destination unless credited; it answers the record.
	Refuse(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error)
	// Debit takes t's units at the source once; it answers pending or refused.
	Debit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error)
	// RefuseDebit tombstones a requested t at the source unless debited; it answers the
	// source's record (refused, or the debit's state).
	RefuseDebit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error)
	// Restore returns a refused transfer's units at the source.
	Restore(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error)
	// Settle records at the source that t was credited.
	Settle(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error)
	// Status reads the region's durable records of transfer id.
	Status(ctx context.Context, id string) (transfer.InState, transfer.OutState, error)
	// SetPaused records at the region whether p's sale (p.SKU "") or SKU admits new holds,
	// unless it has a later change of it; it answers the region's record.
	SetPaused(ctx context.Context, gen int64, p Pause) (paused bool, version PauseVersion, err error)
}

// BooksReader reads one consistent snapshot of a region's durable state for a sale, straight
// from the region's database (region.ReadBooks), so audits need no live region process.
type BooksReader func(ctx context.Context, sale string) (transfer.RegionBooks, error)

// BooksOfReader is BooksReader of several sales in one snapshot (region.ReadBooksOf), at most
// transfer.MaxBooksSales at a time; every sale asked for is in the answer.
type BooksOfReader func(ctx context.Context, sales []string) (map[string]transfer.RegionBooks, error)

// RegionLink is everything the coordinator knows of one region.
type RegionLink struct {
	Name        string
	Address     string
	Participant Participant
	Books       BooksReader
	// BooksOf, when set, reads many sales' books at once: an audit of every sale then costs
	// the region's database a transaction per transfer.MaxBooksSales sales, not one per sale.
	BooksOf BooksOfReader
	// Demand feeds the rebalancer; a region without it counts as having no recent demand.
	Demand DemandReader
	// Resolve, when set, names the address of the region's current leader ("" if unknown).
	Resolve func() string
	// Unsold feeds the sold-out flags.
	Unsold UnsoldReader
	// Watch, when set, tells of the sales whose stock at this region may have changed
	// (region.WatchStock), so the sold-out loop and the rebalancer read a region's idle sales
	// only when they change; without it every sale is read every round.
	Watch ChangeWatcher
	// BuyerUnits, when set, streams the region's buyers' units of a sale (AuditLimits); a
	// region without it leaves the per-user limit unproven.
	BuyerUnits BuyerUnitsReader
	// LatePayments, when set, lists the region's late payments (LatePayments).
	LatePayments LatePaymentsReader
}

// CurrentAddress is where the region's leader answers now, as far as the coordinator knows.
func (l RegionLink) CurrentAddress() string {
	if l.Resolve != nil {
		if a := l.Resolve(); a != "" {
			return a
		}
	}
	return l.Address
}

// Config tunes the coordinator.
type Config struct {
	Regions []RegionLink
	// Clock tells the time; default the wall clock.
	Clock clock.Clock
	// RetryInterval is how often unfinished transfers are driven again; default 1s.
	RetryInterval time.Duration
	// StrandAfter is how long a transfer may stay in flight with its destination not
	// answering before it is flagged stranded; default 30s.
	StrandAfter time.Duration
	// CallTimeout bounds one call to a region; default 5s.
	CallTimeout time.Duration
	Logger      *slog.Logger
	// PublishFlag, when set, receives the sold-out and drained flags of each SKU whenever
	// they change (see soldOutLoop); SoldOutInterval is how often they are recomputed
	// (default 500ms).
	PublishFlag     func(ctx context.Context, f fencing.Flag, sale, sku string, on bool) error
	SoldOutInterval time.Duration
	// WatchFlags, when set, follows the flags etcd holds; one that differs from what was
	// published is derived again from the books (flagwatch.go).
	WatchFlags FlagWatcher
	// Bindings, when set, are the buyers' bindings in etcd; one naming a region the cluster
	// does not have is removed (bindcheck.go).
	Bindings Bindings
	// AuditInterval is how often the leader audits every sale and pauses each SKU whose
	// conservation (I1) is broken (auditor.loop); 0 (the zero value, unlike the other
	// intervals) never: quotad passes DefaultAuditInterval unless --audit-interval says
	// otherwise, and 0 there means never too.
	AuditInterval time.Duration
	// AuditRetention is how long the continuous audit's rounds are kept in the ledger
	// (audithistory.go); 0 is DefaultAuditRetention.
	AuditRetention time.Duration
	// Auto tunes the automatic rebalancer; its zero value is off (quotad turns it on unless
	// --auto-rebalance=false).
	Auto AutoRebalance
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if why := transfer.CheckRegion(r.Name); why != "" {
			return fmt.Errorf("region %q: %s", r.Name, why)
		}
		if seen[r.Name] {
			return fmt.Errorf("region %q listed twice", r.Name)
		}
		seen[r.Name] = true
		if r.Participant == nil || r.Books == nil {
			return fmt.Errorf("region %q: needs a participant and a books reader", r.Name)
		}
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = time.Second
	}
	if c.StrandAfter == 0 {
		c.StrandAfter = 30 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 5 * time.Second
	}
	if c.SoldOutInterval == 0 {
		c.SoldOutInterval = 500 * time.Millisecond
	}
	if c.RetryInterval < 0 || c.StrandAfter < 0 || c.CallTimeout < 0 {
		return errors.New("retry interval, strand-after and call timeout must be positive")
	}
	if c.AuditInterval < 0 {
		return fmt.Errorf("audit interval %s: must not be negative (0: no continuous audit)", c.AuditInterval)
	}
	if c.AuditRetention == 0 {
		c.AuditRetention = DefaultAuditRetention
	}
	if c.AuditRetention < 0 {
		return fmt.Errorf("audit retention %s: must be positive", c.AuditRetention)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.Auto.withDefaults()
}

// Coordinator is the ledger's owner and the facade of its parts: the ledger (ledger.go,
// ledgersql.go), the transfer driver's loop (driveloop.go) around the state machine
// (drive.go), the delivery of sale terms (terms.go) and pauses (pause.go), the audit
// (audit.go, auditloop.go), the rebalancer (rebalance.go, autorebalance.go) and the stock
// flags (soldout.go, flagwatch.go, bindcheck.go). It changes the ledger only while it
// leads, under the generation it was elected with.
type Coordinator struct {
	cfg     Config
	ledger  *ledger
	regions *regionSet
	driver  *transferDriver
	terms   *termsCourier
	pauses  *pauser
	audit   *auditor
	rebal   *rebalancer
	flags   *stockFlags

	mu     sync.Mutex
	gen    int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New builds a coordinator on a migrated ledger database.
func New(cfg Config, db *pgxpool.Pool) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Coordinator{cfg: cfg}
	conf := &c.cfg
	c.ledger = &ledger{db: db, clock: cfg.Clock}
	c.regions = newRegionSet(cfg.Regions)
	c.driver = &transferDriver{cfg: conf, ledger: c.ledger, regions: c.regions}
	c.terms = &termsCourier{cfg: conf, ledger: c.ledger, regions: c.regions}
	c.pauses = &pauser{cfg: conf, ledger: c.ledger, regions: c.regions}
	c.audit = &auditor{cfg: conf, ledger: c.ledger, pause: c.SetPaused}
	c.rebal = &rebalancer{cfg: conf, ledger: c.ledger, regions: c.regions, generation: c.Generation, transfer: c.Transfer}
	c.flags = &stockFlags{cfg: conf, ledger: c.ledger, regions: c.regions}
	return c, nil
}

// Lead starts acting as the leader with generation gen (the election key's create
// revision): it raises the ledger fence (I4), then resumes every unfinished transfer, the
// delivery of sale terms and pauses, and (with AuditInterval) the continuous audit.
func (c *Coordinator) Lead(ctx context.Context, gen int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		return errors.New("coordinator: already leading")
	}
	err := pgutil.Tx(ctx, c.ledger.db, func(tx pgx.Tx) error {
		if err := c.ledger.checkFence(ctx, tx, gen); err != nil {
			return err
		}
		if err := queuePausesForNewRegions(ctx, tx, c.regions.names()); err != nil {
			return err
		}
		return queueTermsForNewRegions(ctx, tx, c.regions.names())
	})
	if err != nil {
		return err
	}
	dctx, cancel := context.WithCancel(context.Background())
	c.gen, c.cancel = gen, cancel
	c.audit.newTerm() // a count of an earlier term is no news of this one
	st := c.rebal.newState()
	feed := newChangeFeed(changeSources(c.cfg.Regions), st.wake)
	st.live = feed.live
	c.rebal.state.Store(st)
	feed.watch(dctx, &c.wg, c.ledger.db, c.cfg.Regions, c.cfg.Logger)
	c.wg.Go(func() { c.flags.bindCheckLoop(dctx) })
	c.wg.Go(func() { c.driver.loop(dctx, gen) })
	c.wg.Go(func() { c.terms.loop(dctx, gen) })
	c.wg.Go(func() { c.flags.soldOutLoop(dctx, feed) })
	c.wg.Go(func() { c.pauses.loop(dctx, gen) })
	c.wg.Go(func() { c.audit.loop(dctx, gen) })
	c.wg.Go(func() { c.rebal.loop(dctx, gen) })
	c.cfg.Logger.Info("coordinator leading", "generation", gen)
	return nil
}

// StepDown stops leading. Idempotent.
func (c *Coordinator) StepDown() {
	c.mu.Lock()
	cancel := c.cancel
	c.cancel, c.gen = nil, 0
	c.mu.Unlock()
	if cancel != nil {
		cancel()
		c.wg.Wait()
	}
}

// Close stops the coordinator; the caller owns the database pool.
func (c *Coordinator) Close() { c.StepDown() }

// Generation is the generation this coordinator leads with, or ErrNotLeader.
func (c *Coordinator) Generation() (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == 0 {
		return 0, fmt.Errorf("coordinator: %w", ErrNotLeader)
	}
	return c.gen, nil
}

// Regions lists the configured regions in order.
func (c *Coordinator) Regions() []RegionLink { return c.cfg.Regions }

// FenceRejections counts the ledger transactions this process began that the generation
// fence refused: a newer coordinator had written (I4), so they changed nothing.
func (c *Coordinator) FenceRejections() int64 { return c.ledger.rejected.Load() }

// AuditViolations is the number of violations the continuous audit found in its last round
// while this coordinator leads (0 before its first round).
func (c *Coordinator) AuditViolations() int64 { return c.audit.violations.Load() }

// AuditDuration is how long the continuous audit's last round in this term took (every
// sale read and evaluated), a round that failed included; zero before the first.
func (c *Coordinator) AuditDuration() time.Duration { return time.Duration(c.audit.took.Load()) }

// AuditedAt is when the continuous audit's last round in this term ended; zero before the
// first.
func (c *Coordinator) AuditedAt() time.Time {
	if ns := c.audit.auditedAt.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}
