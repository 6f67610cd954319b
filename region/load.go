package region

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/transfer"
)

// loadMem reads the region's state from SQL in one snapshot: the pools, the pauses, which
// sales have an archive (archived_pools), and every hold in holds; never the archive itself
// (holds_closed, archived_users: archive.go), so its cost does not grow with the history. A
// hold closed within retain of now is kept whole and queued to retire like one closed by this
// leader, so a reload (after a failed batch, or a quick takeover) leaves recent retries
// answered from memory; one closed earlier is retired at once.
func loadMem(ctx context.Context, db *pgxpool.Pool, region string, now time.Time, retain time.Duration) (*memState, error) {
	m := newMemState()
	m.archive = true
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	if err := loadPools(ctx, tx, m); err != nil {
		return nil, fmt.Errorf("load pools: %w", err)
	}
	if err := loadPauses(ctx, tx, m); err != nil {
		return nil, err
	}
	if err := loadArchivedPools(ctx, tx, m); err != nil {
		return nil, fmt.Errorf("load archived pools: %w", err)
	}
	if err := loadHolds(ctx, tx, m, region, now, retain); err != nil {
		return nil, fmt.Errorf("load holds: %w", err)
	}
	// No forced collection here (debug.FreeOSMemory): the load now makes little garbage, and
	// marking a million holds once more held the takeover up by about a second, while the
	// peak resident memory stayed the same without it (BenchmarkLeaderMemory).
	return m, nil
}

// loadPools reads every pool's counters into m, in tx's snapshot.
func loadPools(ctx context.Context, tx pgx.Tx, m *memState) error {
	rows, err := tx.Query(ctx, `SELECT sale_id, sku, available, held, sold FROM pools`)
	if err != nil {
		return err
	}
	var k poolKey
	var a, h, s int64
	_, err = pgx.ForEachRow(rows, []any{&k.sale, &k.sku, &a, &h, &s}, func() error {
		m.pools[k] = &memPool{available: transfer.Units(a), held: transfer.Units(h), sold: transfer.Units(s)}
		return nil
	})
	return err
}

// loadArchivedPools reads, in tx's snapshot, the pools that have archived holds: their sales
// are lazy (archive.go), and their archived sold units are not in any buyer's count yet. It
// also takes the highest archiving stamp (through holds_closed_by_archived) into m.changed: a
// batch that only archived stamped no row of holds, and the next leader's stamps must still
// rise above it (standby.go).
func loadArchivedPools(ctx context.Context, tx pgx.Tx, m *memState) error {
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(archived), 0) FROM holds_closed`).Scan(&m.changed); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT sale_id, sku, sold FROM archived_pools`)
	if err != nil {
		return err
	}
	var k poolKey
	var sold int64
	_, err = pgx.ForEachRow(rows, []any{&k.sale, &k.sku, &sold}, func() error {
		m.lazy[k.sale] = true
		m.archivedSold[k] = transfer.Units(sold)
		return nil
	})
	return err
}

// loadHolds reads every stored hold into m, in tx's snapshot: whole, or retired at once if it
// closed before now minus retain (see loadMem).
func loadHolds(ctx context.Context, tx pgx.Tx, m *memState, region string, now time.Time, retain time.Duration) error {
	keepAfter := now.Add(-retain)
	kept, err := m.presize(ctx, tx, keepAfter)
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT `+loadColumns+` FROM holds`)
	if err != nil {
		return err
	}
	defer rows.Close()
	// Decoding the rows and filling the maps each take about half of a takeover's CPU, so a
	// goroutine of its own fills the maps, a chunk of rows at a time, while this one decodes
	// the next rows. It has ended before loadHolds returns, on every path.
	f := newFiller(m, now, keepAfter, kept)
	defer f.stop()
	sc := newRowScanner(region)
	chunk := f.empty()
	for rows.Next() {
		chunk = append(chunk, loadedRow{})
		if err := sc.scan(rows, &chunk[len(chunk)-1]); err != nil {
			return err
		}
		if len(chunk) == cap(chunk) {
			f.full <- chunk
			chunk = f.empty()
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	f.full <- chunk
	f.stop()
	m.changed = max(m.changed, sc.changed)
	heap.Init(&m.due)
	// retireClosed takes the queue oldest first.
	slices.SortFunc(m.closing, func(a, b closedAt) int { return a.at.Compare(b.at) })
	return nil
}

// loadedRow is a stored hold as read, on its way from the rows to the maps.
type loadedRow struct {
	hold   Hold
	hash   [16]byte
	closed pgtype.Timestamptz // a value, not a pointer: no allocation per row
	stamp  int64              // its changed stamp, 0 when NULL
}

// loadColumns are the columns of a hold a load reads (rowScanner).
const loadColumns = holdColumns + `, request_hash, closed_at, changed`

// rowScanner reads rows of loadColumns, and keeps the highest changed stamp among them. Its
// destinations are set up once: a Scan's argument list made per row put a dozen values on the
// heap per row, garbage that the collector had to keep up with as the load went on.
type rowScanner struct {
	region                 string
	names                  interner // sales, SKUs and states: a table of its own stays small and quick
	row                    loadedRow
	sale, sku, state, hash pgtype.DriverBytes
	quantity               int64
	stamp                  pgtype.Int8 // NULL in rows older than the changed column
	changed                int64       // the highest stamp scanned
	dest                   []any
}

func newRowScanner(region string) *rowScanner {
	s := &rowScanner{region: region, names: interner{}}
	h := &s.row.hold
	s.dest = []any{&h.ID, &s.sale, &s.sku, &h.User, &s.quantity, &h.RequestKey, &s.state, &h.CreatedAt, &h.ExpiresAt, &h.PaymentID, &h.Admission, &h.CartID, &s.hash, &s.row.closed, &s.stamp}
	return s
}

// scan reads the current row into r. Holds share sales, SKUs and states, so those are read
// as the driver's bytes and interned (a string is made the first time a value is seen, not
// per row), and the fingerprint is decoded from its bytes (fingerprint: a bad one fails the
// load).
func (s *rowScanner) scan(rows pgx.Rows, r *loadedRow) error {
	if err := rows.Scan(s.dest...); err != nil {
		return err
	}
	h := &s.row.hold
	h.Region, h.Quantity = s.region, transfer.Units(s.quantity)
	s.row.stamp = 0
	if s.stamp.Valid {
		s.changed = max(s.changed, s.stamp.Int64)
		s.row.stamp = s.stamp.Int64
	}
	h.Sale, h.SKU, h.State = s.names.ofBytes(s.sale), s.names.ofBytes(s.sku), HoldState(s.names.ofBytes(s.state))
	var err error
	if s.row.hash, err = fingerprint(h.ID, s.hash); err != nil {
		return err
	}
	*r = s.row
	return nil
}

// loadChunk rows go to the filler at a time; loadChunks of them wait at most.
const loadChunk, loadChunks = 256, 4

// filler owns a state being loaded, from newFiller to stop: its goroutine adds each row it
// is sent to the state's maps. Chunks go back and forth between the two goroutines, so the
// load allocates no chunk per row or per chunk.
type filler struct {
	m         *memState
	now       time.Time
	keepAfter time.Time
	in        interner // users and request keys of the holds kept whole
	full      chan []loadedRow
	free      chan []loadedRow
	done      chan struct{}
	stopped   bool
}

// newFiller starts the goroutine that fills m: holds closed after keepAfter stay whole, and
// kept of them (held ones included) are to, as counted.
func newFiller(m *memState, now, keepAfter time.Time, kept int64) *filler {
	f := &filler{m: m, now: now, keepAfter: keepAfter, in: make(interner, 2*kept),
		full: make(chan []loadedRow, loadChunks), free: make(chan []loadedRow, loadChunks+1), done: make(chan struct{})}
	// One chunk more than full holds: a send to free never blocks.
	for range loadChunks + 1 {
		f.free <- make([]loadedRow, 0, loadChunk)
	}
	go f.run()
	return f
}

// empty returns a chunk to fill with rows, once the filler has one to spare.
func (f *filler) empty() []loadedRow { return <-f.free }

// stop sends no more rows and waits until the filler has added those sent; idempotent.
// Only then may the caller touch the state again.
func (f *filler) stop() {
	if f.stopped {
		return
	}
	f.stopped = true
	close(f.full)
	<-f.done
}

func (f *filler) run() {
	defer close(f.done)
	for chunk := range f.full {
		for i := range chunk {
			f.add(&chunk[i])
		}
		clear(chunk) // the spare chunk keeps no retired hold's strings alive
		f.free <- chunk[:0]
	}
}

// add puts one stored hold into the state: whole if held or closed within the retention,
// else only its user's count and its key's digest (archive.go).
func (f *filler) add(r *loadedRow) {
	h, m := r.hold, f.m
	m.keysPer[saleUser{h.Sale, h.User}]++
	m.useTicket(h)
	if h.State != Held && (!r.closed.Valid || !r.closed.Time.After(f.keepAfter)) {
		// Closed long enough: its user and key are not interned (a user's count keeps the
		// user's first copy).
		m.count(&memHold{Hold: h})
		m.retireKey(keyKey{h.Sale, h.User, h.RequestKey})
		return
	}
	h.User, h.RequestKey = f.in.of(h.User), f.in.of(h.RequestKey)
	m.addLoaded(&memHold{Hold: h, hash: r.hash})
	if h.State != Held {
		// Another leader's clock may have run ahead of this one's: queued at a later time
		// than now, the hold would hold up the retiring of every hold queued after it.
		// Retiring it sooner is safe, since a retired hold is read back from SQL.
		at := r.closed.Time
		if at.After(f.now) {
			at = f.now
		}
		m.closing = append(m.closing, closedAt{at, h.ID})
	}
}

// presize makes the maps a load fills as large as the stored holds need, counted in the
// load's own snapshot: growing them a row at a time rehashed every entry again and again,
// which took about a third of a takeover's CPU. The count is one scan that PostgreSQL runs
// on its own; users are sized for one per held or sold hold, an upper bound, and the
// interner of kept holds' users and keys for two strings per kept hold.
func (m *memState) presize(ctx context.Context, tx pgx.Tx, keepAfter time.Time) (kept int64, err error) {
	var total, held, counted int64
	err = tx.QueryRow(ctx, `SELECT count(*),
		count(*) FILTER (WHERE state = 'held' OR closed_at > $1),
		count(*) FILTER (WHERE state = 'held'),
		count(*) FILTER (WHERE state IN ('held', 'sold'))
		FROM holds`, keepAfter).Scan(&total, &kept, &held, &counted)
	if err != nil {
		return 0, fmt.Errorf("count holds: %w", err)
	}
	m.rows = total
	m.holds = make(map[string]*memHold, kept)
	m.keys = make(map[keyKey]*memHold, kept)
	m.users = make(map[userKey]*memUser, counted)
	m.keysPer = make(map[saleUser]int32, counted)
	m.tickets = map[uint64]uint64{}
	m.due = make(expiryHeap, 0, held)
	m.closing = make([]closedAt, 0, kept-held)
	return kept, nil
}

// addLoaded adds a stored hold to a state being loaded: the hold and its key, its user's
// counts, and (while held) its deadline. Whoever loads heap.Inits due once every hold is in.
func (m *memState) addLoaded(h *memHold) {
	m.put(h)
	m.count(h)
	if h.State == Held {
		m.due = append(m.due, dueHold{h.ExpiresAt, h.ID})
	}
}

// count adds a loaded hold to its user's counts: what a user holds and has bought are sums
// over the user's holds (I2's per-user limit is checked against them).
func (m *memState) count(h *memHold) {
	if h.State != Held && h.State != Sold {
		return
	}
	k := userKey{h.Sale, h.SKU, h.User}
	u := m.users[k]
	if u == nil {
		u = &memUser{}
		m.users[k] = u
	}
	if h.State == Held {
		u.held += h.Quantity
	} else {
		u.bought += h.Quantity
	}
}

// interner keeps one copy of each string it is given, so that many holds share it.
type interner map[string]string

// of returns the copy of s kept, s itself the first time.
func (in interner) of(s string) string {
	if c, ok := in[s]; ok {
		return c
	}
	in[s] = s
	return s
}

// ofBytes is of for bytes that are not kept: a string is made of them only the first time.
func (in interner) ofBytes(b []byte) string {
	if c, ok := in[string(b)]; ok {
		return c
	}
	s := string(b)
	in[s] = s
	return s
}
