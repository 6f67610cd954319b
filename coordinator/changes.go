package coordinator

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/pgutil"
)

// ChangeWatcher listens for the sales whose stock may have changed at one source (a region's
// database, region.WatchStock; the ledger): it calls ready once listening (everything before
// is unknown to it), then changed with each such sale, until ctx ends or it fails.
type ChangeWatcher func(ctx context.Context, ready func(), changed func(sale string)) error

// LedgerChannel is the notification channel on which the ledger names a sale whose
// unallocated units or unfinished transfers changed (migration 8).
const LedgerChannel = "quota_ledger"

// maxChangedSales bounds the sales a change feed remembers between two rounds; past it, the
// next round reads every sale instead.
const maxChangedSales = 100_000

// changeFeed is the leader's list of the sales whose stock may have changed since its
// sold-out loop last read them, fed by the notifications of the ledger and of every region
// database. While any source is not listening (not yet, or its connection failed), or after
// a source (re)starts listening, a round reads every sale: a change may have been missed.
// The flags it feeds choose answers only (soldOutLoop); nothing is granted on it.
type changeFeed struct {
	mu      sync.Mutex
	changed map[string]bool
	all     bool
	down    int // sources not listening now
	// wake is told of every changed sale at once (the rebalancer plans it at its next round).
	wake func(sale string)
}

// newChangeFeed is a feed of sources sources, none listening yet.
func newChangeFeed(sources int, wake func(sale string)) *changeFeed {
	return &changeFeed{changed: map[string]bool{}, all: true, down: sources, wake: wake}
}

// listening records that a source listens from now on; what it missed is read next round.
func (f *changeFeed) listening() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down--
	f.all = true
}

// stopped records that a source that was listening stopped.
func (f *changeFeed) stopped() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down++
}

// live reports whether every source listens, so an unchanged sale needs no reading.
func (f *changeFeed) live() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down == 0
}

// saleChanged records that sale's stock may have changed.
func (f *changeFeed) saleChanged(sale string) {
	f.again(sale)
	if f.wake != nil {
		f.wake(sale)
	}
}

// again asks the next round to read sale (again), without waking the rebalancer.
func (f *changeFeed) again(sale string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.all {
		return
	}
	if len(f.changed) >= maxChangedSales {
		f.all, f.changed = true, map[string]bool{}
		return
	}
	f.changed[sale] = true
}

// take answers what a round must read, and forgets it: every sale (all), or the sales that
// changed, in order.
func (f *changeFeed) take() (all bool, sales []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.all || f.down > 0 {
		f.all = false
		clear(f.changed)
		return true, nil
	}
	for s := range f.changed {
		sales = append(sales, s)
	}
	clear(f.changed)
	slices.Sort(sales)
	return false, sales
}

// putBack returns what a round could not read to the next round.
func (f *changeFeed) putBack(all bool, sales []string) {
	if all {
		f.mu.Lock()
		f.all = true
		f.mu.Unlock()
		return
	}
	for _, s := range sales {
		f.again(s)
	}
}

// watch starts one listener per source of changes: the ledger (db), and each region whose
// link has a Watch. A region without one is never listening, so every round reads every sale,
// as a loop without notifications must. Each listener is a goroutine of the term that wg
// waits for.
func (f *changeFeed) watch(ctx context.Context, wg *sync.WaitGroup, db *pgxpool.Pool, regions []RegionLink, log *slog.Logger) {
	ledger := func(ctx context.Context, ready func(), changed func(string)) error {
		return pgutil.Listen(ctx, db, LedgerChannel, ready, changed)
	}
	wg.Go(func() { f.listenLoop(ctx, log, "ledger", ledger) })
	for _, r := range regions {
		if r.Watch != nil {
			wg.Go(func() { f.listenLoop(ctx, log, "region "+r.Name, r.Watch) })
		}
	}
}

// changeSources is how many sources a feed of a coordinator with regions waits for: the
// ledger and every region (one without a Watch never answers, which keeps the feed reading
// everything).
func changeSources(regions []RegionLink) int { return 1 + len(regions) }

// listenLoop keeps one source listening until ctx ends, trying again after a failure with a
// backoff from 100ms to 5s (reset once it listens again), and logs each failure to log.
func (f *changeFeed) listenLoop(ctx context.Context, log *slog.Logger, source string, watch ChangeWatcher) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		up := false
		err := watch(ctx, func() { up = true; f.listening() }, f.saleChanged)
		if up {
			f.stopped()
			wait = 100 * time.Millisecond
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("listening for stock changes failed; every sale is read each round until it listens again",
			"source", source, "err", err, "retry_in", wait)
		if clock.Sleep(ctx, wait) != nil {
			return // the term ended
		}
		wait = min(2*wait, 5*time.Second)
	}
}
