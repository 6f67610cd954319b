package region

import (
	"container/heap"
	"context"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/transfer"
)

// memPool is a pool's counters as the leader decides on them.
type memPool struct{ available, held, sold transfer.Units }

type userKey struct{ sale, sku, user string }

// memUser is one user's units of one SKU: held now, and bought.
type memUser struct{ held, bought transfer.Units }

type keyKey struct{ sale, user, key string }

// memHold is one hold as the leader knows it. It is replaced, never changed, when the hold
// changes state, so a pointer published to readers stays a consistent snapshot.
type memHold struct {
	Hold
	hash [16]byte
}

// memState is the region leader's authoritative working copy of its pools, per-user counts,
// holds and idempotency keys, loaded from SQL when it takes leadership (DESIGN.md §5, hot
// path). Only the writer goroutine reads or changes it. Changes made while deciding a batch
// are durable only once the batch commits; a failed batch makes the leader reload it.
type memState struct {
	pools map[poolKey]*memPool
	users map[userKey]*memUser
	due   expiryHeap
	// keys and holds hold what is committed: the writer changes them only after a commit,
	// under mu, so requests may read them (an empty pool answers from them) without the
	// writer. A batch's own changes wait in its overlay until then.
	mu    sync.RWMutex
	keys  map[keyKey]*memHold
	holds map[string]*memHold
	// archive is set for a state loaded from SQL: only then can a closed hold be dropped
	// from memory (archive.go), since only then can it be read back. closing queues the
	// committed closed holds still kept whole, oldest first; retired has the key digests of
	// those dropped, under seed.
	archive bool
	closing []closedAt
	retired map[uint64]struct{}
	seed    maphash.Seed
}

type dueHold struct {
	at time.Time
	id string
}

// expiryHeap orders live holds by deadline; entries of holds closed since are skipped when
// popped.
type expiryHeap []dueHold

// Len, Less, Swap, Push and Pop make expiryHeap a container/heap.
func (h expiryHeap) Len() int { return len(h) }

// Less orders by deadline.
func (h expiryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }

// Swap swaps two entries.
func (h expiryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

// Push adds an entry (container/heap calls it).
func (h *expiryHeap) Push(x any) { *h = append(*h, x.(dueHold)) }

// Pop removes the last entry (container/heap calls it).
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// put records h (new or in a new state) in the state's maps; the caller holds mu or owns m.
func (m *memState) put(h *memHold) {
	m.holds[h.ID] = h
	m.keys[keyKey{h.Sale, h.User, h.RequestKey}] = h
}

// committedKey returns the committed hold of an idempotency key; safe from any goroutine.
func (m *memState) committedKey(k keyKey) (*memHold, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	h, ok := m.keys[k]
	return h, ok
}

// publish makes a committed batch's holds visible to readers; at is the batch's decision
// time, from which its closed holds' retention counts.
func (m *memState) publish(overlay map[string]*memHold, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range overlay {
		m.put(h)
		if m.archive && h.State != Held {
			m.closing = append(m.closing, closedAt{at, h.ID})
		}
	}
}

// hashOf is the 16-byte form of a request fingerprint kept in memory.
func hashOf(hexHash string) [16]byte {
	var h [16]byte
	_, _ = hex.Decode(h[:], []byte(hexHash))
	return h
}

// newMemState returns an empty state: no pools, users or holds.
func newMemState() *memState {
	return &memState{pools: map[poolKey]*memPool{}, users: map[userKey]*memUser{}, keys: map[keyKey]*memHold{}, holds: map[string]*memHold{},
		retired: map[uint64]struct{}{}, seed: maphash.MakeSeed()}
}

// loadMem reads the region's state from SQL in one snapshot. A hold closed within retain of
// now is kept whole and queued to retire like one closed by this leader, so a reload (after
// a failed batch, or a quick takeover) leaves recent retries answered from memory; one closed
// earlier is retired at once (archive.go).
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
	if err := loadHolds(ctx, tx, m, region, now, retain); err != nil {
		return nil, fmt.Errorf("load holds: %w", err)
	}
	// Loading made garbage several times the size of what it kept (the interner among it):
	// give it back now rather than carry it as resident memory until the next collections.
	debug.FreeOSMemory()
	return m, nil
}

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

func loadHolds(ctx context.Context, tx pgx.Tx, m *memState, region string, now time.Time, retain time.Duration) error {
	keepAfter := now.Add(-retain)
	names := interner{}
	kept, err := m.presize(ctx, tx, keepAfter)
	if err != nil {
		return err
	}
	in := make(interner, 2*kept)
	rows, err := tx.Query(ctx, `SELECT `+holdColumns+`, request_hash, closed_at FROM holds`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var hash string
		var closed pgtype.Timestamptz // a value, not a pointer: no allocation per row
		h, err := scanHold(rows, region, &hash, &closed)
		if err != nil {
			return err
		}
		// Holds share sales, SKUs and states: keep one copy of each string, from a table of
		// its own, which stays small and quick.
		h.Sale, h.SKU, h.State = names.of(h.Sale), names.of(h.SKU), HoldState(names.of(string(h.State)))
		if h.State != Held && (!closed.Valid || !closed.Time.After(keepAfter)) {
			// Closed long enough: only its user's bought count and its key's digest stay, so
			// its user and key are not interned (a user's count keeps the user's first copy).
			m.count(&memHold{Hold: h})
			m.retired[m.keyDigest(keyKey{h.Sale, h.User, h.RequestKey})] = struct{}{}
			continue
		}
		// Holds kept whole share users and request keys too.
		h.User, h.RequestKey = in.of(h.User), in.of(h.RequestKey)
		m.addLoaded(&memHold{Hold: h, hash: hashOf(hash)})
		if h.State != Held {
			// Another leader's clock may have run ahead of this one's: queued at a later
			// time than now, the hold would hold up the retiring of every hold queued after
			// it. Retiring it sooner is safe, since a retired hold is read back from SQL.
			at := closed.Time
			if at.After(now) {
				at = now
			}
			m.closing = append(m.closing, closedAt{at, h.ID})
		}
	}
	heap.Init(&m.due)
	// retireClosed takes the queue oldest first.
	slices.SortFunc(m.closing, func(a, b closedAt) int { return a.at.Compare(b.at) })
	return rows.Err()
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
	m.holds = make(map[string]*memHold, kept)
	m.keys = make(map[keyKey]*memHold, kept)
	m.users = make(map[userKey]*memUser, counted)
	m.retired = make(map[uint64]struct{}, total-kept)
	m.due = make(expiryHeap, 0, held)
	m.closing = make([]closedAt, 0, kept-held)
	return kept, nil
}

// addLoaded adds a stored hold to a state being loaded: the hold and its key, its user's
// counts, and (while held) its deadline. The caller heap.Inits due once every hold is in.
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

type interner map[string]string

func (in interner) of(s string) string {
	if c, ok := in[s]; ok {
		return c
	}
	in[s] = s
	return s
}
