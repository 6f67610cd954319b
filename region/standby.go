package region

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// A warm standby keeps its own copy of the region's state while another process leads, and
// refreshes it every Config.StandbyRefresh from the holds stamped since (holds.changed, one
// stamp per batch, rising: memState.changed). At takeover it reads only what changed since
// its last refresh instead of every hold, so a failover stays within the lease TTL plus a
// little even for a region with a million live holds (a full load takes seconds there).
//
// Why catching up is exact: the writer commits one batch at a time, each stamped one higher
// than the highest stamp it knows to be stored, and a new leader starts from what it loads
// after the epoch fence has stopped the old one. So a batch that a snapshot does not show
// has a higher stamp than every batch it does, and reading `changed > m.changed` in a later
// snapshot finds every hold written since. Each row read is the hold's current version, and
// a hold only ever goes from held to closed, so applying a row twice changes nothing.

// warmCopy is a standby's copy of the region's state, kept while another process leads and
// handed to this process's leadership at takeover (loadForTakeover). The copy belongs to
// whoever holds warmSem, a one-slot semaphore held for a whole refresh (a channel, so a
// takeover can give up waiting with its context). warmMu guards warmPaused, set while this
// process leads, warmClosed, set by Close, and warmCancel, which cancels the refresh under
// way.
type warmCopy struct {
	cfg  *Config
	pool *pgxpool.Pool

	warmSem    chan struct{}
	warm       *memState
	warmMu     sync.Mutex
	warmPaused bool
	warmClosed bool
	warmCancel context.CancelFunc
	// refreshedAt is when the copy was last brought up to date (unix nanoseconds; 0: never),
	// by the clock of Config.Clock: NodeStatus reports a standby's lag from it.
	refreshedAt atomic.Int64
}

func newWarmCopy(cfg *Config, pool *pgxpool.Pool) *warmCopy {
	return &warmCopy{cfg: cfg, pool: pool, warmSem: make(chan struct{}, 1)}
}

// KeepWarm keeps a warm copy of the region's state while this process does not lead, until
// ctx ends; the caller owns the goroutine it runs on. It returns at once when
// Config.StandbyRefresh is negative (a cold standby: a takeover loads every hold).
func (r *warmCopy) KeepWarm(ctx context.Context) {
	if r.cfg.StandbyRefresh < 0 {
		return
	}
	t := time.NewTicker(r.cfg.StandbyRefresh)
	defer t.Stop()
	defer r.dropWarm()
	for {
		r.refreshWarm(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshWarm loads the warm copy, or brings it up to date, unless this process leads. A
// takeover cancels a refresh under way (takeWarm): a catch-up applies nothing until it has
// read all it needs, so its copy stays as it was; a copy that fails to apply what it read is
// dropped, and loaded whole the next time.
func (r *warmCopy) refreshWarm(ctx context.Context) {
	select {
	case r.warmSem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-r.warmSem }()
	r.warmMu.Lock()
	if r.warmPaused || r.warmClosed {
		r.warmMu.Unlock()
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.warmCancel = cancel
	r.warmMu.Unlock()
	defer func() {
		r.warmMu.Lock()
		r.warmCancel = nil
		r.warmMu.Unlock()
	}()
	var err error
	start := r.cfg.Clock.Now() // the copy shows at least what was stored by then
	r.warm, err = r.warmed(rctx, r.warm)
	if err == nil && r.warm != nil {
		r.refreshedAt.Store(start.UnixNano())
	}
	if err != nil && rctx.Err() == nil {
		r.cfg.Logger.Warn("region standby could not refresh its copy of the state", "region", r.cfg.Name, "err", err)
	}
}

// warmed returns m brought up to date, or the state loaded whole when m is nil. When the
// read fails it returns m as it was; when applying fails, nil.
func (r *warmCopy) warmed(ctx context.Context, m *memState) (*memState, error) {
	now := r.cfg.Clock.Now()
	if m == nil {
		m, err := loadMem(ctx, r.pool, r.cfg.Name, now, r.cfg.Sweep.RetainClosed)
		if err == nil {
			// The copy takes as much memory as the leader's state: a standby near its limit
			// is told now, not when it takes over.
			warnNearMemoryLimit(r.cfg, len(m.holds))
		}
		return m, err
	}
	if _, read, err := r.catchUpCopy(ctx, m, now, false); err != nil {
		if !read {
			return m, err
		}
		return nil, err
	}
	return m, nil
}

// catchUpCopy reads the changes since m's stamp in one snapshot (with count, also how many
// holds are stored: rows) and applies them to m. read says whether the snapshot was read, and
// so whether m may have been changed: a failed read leaves m as it was.
func (r *warmCopy) catchUpCopy(ctx context.Context, m *memState, now time.Time, count bool) (rows int64, read bool, err error) {
	var ch *changes
	err = pgutil.ReadTx(ctx, r.pool, func(tx pgx.Tx) (err error) {
		ch, err = readChanges(ctx, tx, r.cfg.Name, m.changed, count)
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return ch.rows, true, m.catchUp(ch, now, r.cfg.Sweep.RetainClosed)
}

// takeWarm stops the refreshing for as long as this process leads (resumeWarm ends that) and
// hands over the warm copy, nil when there is none. It cancels a refresh under way and waits
// for it to return, which a canceled read does at once.
func (r *warmCopy) takeWarm(ctx context.Context) (*memState, error) {
	r.warmMu.Lock()
	r.warmPaused = true
	if r.warmCancel != nil {
		r.warmCancel()
	}
	r.warmMu.Unlock()
	select {
	case r.warmSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-r.warmSem }()
	m := r.warm
	r.warm = nil
	return m, nil
}

// resumeWarm lets KeepWarm load a copy again, once this process no longer leads. It never
// waits: Lead and StepDown call it holding leadMu.
func (r *warmCopy) resumeWarm() {
	r.warmMu.Lock()
	r.warmPaused = false
	r.warmMu.Unlock()
}

// closeWarm stops the refreshing for good (Region.Close): a refresh under way is canceled,
// and the copy let go.
func (r *warmCopy) closeWarm() {
	r.warmMu.Lock()
	r.warmClosed = true
	if r.warmCancel != nil {
		r.warmCancel()
	}
	r.warmMu.Unlock()
	r.dropWarm()
}

// dropWarm lets the warm copy go, for the collector.
func (r *warmCopy) dropWarm() {
	r.warmSem <- struct{}{}
	r.warm = nil
	<-r.warmSem
}

// changes are what a catch-up reads in one snapshot: every pool's counters, the holds stamped
// after a given stamp, and, for a takeover's check, how many holds are stored.
type changes struct {
	pools  map[poolKey]*memPool
	paused *pauseSet // every pause in force, as stored
	holds  []loadedRow
	// archived are the holds moved to the archive after the given stamp, each with its
	// archiving stamp (archive.go).
	archived []archivedRow
	changed  int64 // the highest stamp among holds and archived
	rows     int64 // -1 when not counted
}

// archivedRow is a hold as read from the archive, with the stamp of the batch that moved it.
type archivedRow struct {
	loadedRow
	archived int64
}

// readChanges reads, in tx's snapshot, the pools and the holds stamped after since; count
// also counts the stored holds.
func readChanges(ctx context.Context, tx pgx.Tx, region string, since int64, count bool) (*changes, error) {
	fresh := newMemState()
	if err := loadPools(ctx, tx, fresh); err != nil {
		return nil, fmt.Errorf("load pools: %w", err)
	}
	if err := loadPauses(ctx, tx, fresh); err != nil {
		return nil, err
	}
	ch := &changes{pools: fresh.pools, paused: fresh.paused, rows: -1}
	rows, err := tx.Query(ctx, `SELECT `+loadColumns+` FROM holds WHERE changed > $1`, since)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	sc := newRowScanner(region)
	for rows.Next() {
		ch.holds = append(ch.holds, loadedRow{})
		if err := sc.scan(rows, &ch.holds[len(ch.holds)-1]); err != nil {
			return nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ch.changed = sc.changed
	if err := readArchived(ctx, tx, region, since, ch); err != nil {
		return nil, err
	}
	if count {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM holds`).Scan(&ch.rows); err != nil {
			return nil, fmt.Errorf("count holds: %w", err)
		}
	}
	return ch, nil
}

// readArchived reads, in tx's snapshot, the holds archived after since into ch (through
// holds_closed_by_archived: what a refresh reads grows with what was archived since, not with
// the archive).
func readArchived(ctx context.Context, tx pgx.Tx, region string, since int64, ch *changes) error {
	rows, err := tx.Query(ctx, `SELECT `+loadColumns+`, archived FROM holds_closed WHERE archived > $1`, since)
	if err != nil {
		return fmt.Errorf("read archived holds: %w", err)
	}
	defer rows.Close()
	sc := newRowScanner(region)
	var stamp int64
	sc.dest = append(sc.dest, &stamp)
	for rows.Next() {
		var r archivedRow
		if err := sc.scan(rows, &r.loadedRow); err != nil {
			return fmt.Errorf("read archived holds: %w", err)
		}
		r.archived = stamp
		ch.archived = append(ch.archived, r)
		ch.changed = max(ch.changed, stamp)
	}
	return rows.Err()
}

// catchUp brings m, a state loaded earlier, up to the snapshot ch was read in: the pools as
// stored, and every hold stamped after m.changed applied over the version m has
// (filler.update). It then does what the leader would have done meanwhile to holds no
// longer needed whole: retires those closed before now minus retain, and drops the passed
// deadlines of closed holds. An error leaves m half caught up: the caller drops it.
func (m *memState) catchUp(ch *changes, now time.Time, retain time.Duration) error {
	f := &filler{m: m, now: now, keepAfter: now.Add(-retain), in: interner{}}
	queued := len(m.closing)
	for i := range ch.holds {
		if err := f.update(&ch.holds[i]); err != nil {
			return err
		}
	}
	if err := f.archived(ch.archived); err != nil {
		return err
	}
	m.changed = max(m.changed, ch.changed)
	m.pools, m.paused = ch.pools, ch.paused
	sortNewlyClosed(m.closing, queued)
	for m.archive && len(m.closing) > 0 && !m.closing[0].at.After(f.keepAfter) {
		m.retireClosed(f.keepAfter)
	}
	m.dropClosedDeadlines(now)
	return nil
}

// sortNewlyClosed keeps the queue of closed holds oldest first once entries from queued on
// were appended: only those are sorted, unless one of them closed before the last of the rest
// (another leader's clock), which needs the whole queue sorted.
func sortNewlyClosed(q []closedAt, queued int) {
	if len(q) == queued {
		return
	}
	byTime := func(a, b closedAt) int { return a.at.Compare(b.at) }
	slices.SortFunc(q[queued:], byTime)
	if queued > 0 && q[queued].at.Before(q[queued-1].at) {
		slices.SortStableFunc(q, byTime)
	}
}

// update applies a hold stamped since m was loaded or last caught up. A hold m does not know
// is added as a load adds it; a held one that has closed since is replaced, its old version's
// counts taken off its user first. One m already has in this state is left as it is.
func (f *filler) update(r *loadedRow) error {
	m, h := f.m, &r.hold
	old := m.holds[h.ID]
	switch {
	case old == nil:
		m.rows++
		due := len(m.due)
		f.add(r)
		if len(m.due) > due {
			heap.Fix(&m.due, len(m.due)-1)
		}
	case old.State == h.State:
	case old.State != Held:
		// Closed holds never change: the copy and the database disagree.
		return fmt.Errorf("hold %s is stored %s, but this copy has it closed as %s", h.ID, h.State, old.State)
	default:
		m.uncount(old)
		m.keysPer[saleUser{old.Sale, old.User}]-- // the same key, added again below
		delete(m.holds, old.ID)
		delete(m.keys, keyKey{old.Sale, old.User, old.RequestKey})
		f.add(r)
	}
	return nil
}

// archived applies holds archived since m was loaded or last caught up, as the leader that
// archived them did (dropArchived). A hold m has whole (held, or closed: then nothing changes)
// or has never seen (its closing stamped after m's stamp, and not in m: held holds are always
// whole) is first applied as a hold changed since, so that each hold is counted once, then
// moved. One m has retired was seen closed.
func (f *filler) archived(rows []archivedRow) error {
	m := f.m
	for i := range rows {
		r := &rows[i]
		if _, whole := m.holds[r.hold.ID]; whole || r.stamp > m.changed {
			if err := f.update(&r.loadedRow); err != nil {
				return err
			}
		}
		m.dropArchived(&r.hold)
	}
	return nil
}

// uncount takes a hold's units off its user's counts (the reverse of count).
func (m *memState) uncount(h *memHold) {
	if h.State != Held && h.State != Sold {
		return
	}
	u := m.users[userKey{h.Sale, h.SKU, h.User}]
	if u == nil {
		panic(fmt.Sprintf("region: hold %s counted for no user", h.ID)) // count added it: a programmer error
	}
	if h.State == Held {
		u.held -= h.Quantity
	} else {
		u.bought -= h.Quantity
	}
}

// dropClosedDeadlines drops the deadlines that have passed and whose hold is no longer held,
// as the leader's sweeper would: a standby has no sweeper, and without this every hold that
// closed would leave its entry behind. Those of holds still held stay, for the new leader's
// sweeper to expire; the leader's own sweeper keeps them few.
func (m *memState) dropClosedDeadlines(now time.Time) {
	var held []dueHold
	for m.due.Len() > 0 && !now.Before(m.due[0].at) {
		d := heap.Pop(&m.due).(dueHold)
		if h := m.holds[d.id]; h != nil && h.State == Held {
			held = append(held, d)
		}
	}
	for _, d := range held {
		heap.Push(&m.due, d)
	}
}

// checkCaughtUp compares a caught-up copy with the snapshot it was caught up to (rows holds
// stored in holds: live and recently closed ones, not the archive, so the count does not grow
// with the history) before a new leader serves from it: as many holds as stored, and each
// pool's held and sold units equal to the sums over its users' counts (I2), plus, for sold,
// the archived units of buyers not resolved (archivedSold). A copy that missed a change (a
// writer that does not stamp holds, such as a binary older than the changed column during a
// rolling upgrade) fails here.
func (m *memState) checkCaughtUp(rows int64) error {
	if rows != m.rows {
		return fmt.Errorf("%d holds stored, %d in the copy", rows, m.rows)
	}
	type sums struct{ held, sold transfer.Units }
	got := map[poolKey]sums{}
	for k, u := range m.users {
		s := got[poolKey{k.sale, k.sku}]
		s.held, s.sold = s.held+u.held, s.sold+u.bought
		got[poolKey{k.sale, k.sku}] = s
	}
	for k, a := range m.archivedSold {
		s := got[k]
		s.sold += a // sold units of archived holds whose buyers the copy has not resolved
		got[k] = s
	}
	for k, p := range m.pools {
		if s := got[k]; s.held != p.held || s.sold != p.sold {
			return fmt.Errorf("pool %s/%s stores %d held and %d sold, the copy's users (and archive) %d and %d", k.sale, k.sku, p.held, p.sold, s.held, s.sold)
		}
		delete(got, k)
	}
	for k, s := range got {
		if s != (sums{}) {
			return fmt.Errorf("no pool %s/%s stored, but the copy's users hold %d and bought %d of it", k.sale, k.sku, s.held, s.sold)
		}
	}
	return nil
}

// loadForTakeover is a new leader's load, after the epoch fence: the warm copy caught up and
// checked against one snapshot when there is one, else every hold. A copy that fails to
// apply or to check is reported and let go, and every hold is loaded instead; when the
// changes cannot even be read, the takeover fails and the copy is kept. It says which load
// it did.
func (r *warmCopy) loadForTakeover(ctx context.Context) (*memState, string, error) {
	m, err := r.takeWarm(ctx)
	if err != nil {
		return nil, "", err
	}
	now := r.cfg.Clock.Now()
	if m != nil {
		read, err := r.catchUpForTakeover(ctx, m, now)
		if err == nil {
			return m, "warm", nil
		}
		if !read {
			// Nothing was applied, and a full load would read the same database: this
			// takeover fails, and the copy stays, as good as before, for the next one.
			r.putWarmBack(m)
			return nil, "", fmt.Errorf("catch up the standby's copy: %w", err)
		}
		r.cfg.Logger.Error("region standby's copy of the state is unusable; loading every hold", "region", r.cfg.Name, "err", err)
		m = nil // not live during the load
	}
	m, err = loadMem(ctx, r.pool, r.cfg.Name, now, r.cfg.Sweep.RetainClosed)
	return m, "full", err
}

// catchUpForTakeover catches m up to one snapshot and checks it against the same snapshot.
// read says whether the snapshot was read, and so whether m may have been changed.
func (r *warmCopy) catchUpForTakeover(ctx context.Context, m *memState, now time.Time) (read bool, err error) {
	rows, read, err := r.catchUpCopy(ctx, m, now, true)
	if err != nil {
		return read, err
	}
	return true, m.checkCaughtUp(rows)
}

// putWarmBack keeps m as the warm copy again, after a takeover failed before it changed m: a
// later takeover, or the next refresh once this process stands by again, starts from it.
func (r *warmCopy) putWarmBack(m *memState) {
	r.warmSem <- struct{}{}
	if r.warm == nil {
		r.warm = m
	}
	<-r.warmSem
}
