package region

import (
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/quotaworks/quota/transfer"
)

// memPool is a pool's counters as the leader decides on them.
type memPool struct{ available, held, sold transfer.Units }

type userKey struct{ sale, sku, user string }

// memUser is one user's units of one SKU: held now, and bought.
type memUser struct{ held, bought transfer.Units }

type keyKey struct{ sale, user, key string }

// saleUser is one buyer in one sale: the unit the cap on request keys counts (Config.MaxKeysPerUser).
type saleUser struct{ sale, user string }

// memHold is one hold as the leader knows it. It is replaced, never changed, when the hold
// changes state, so a pointer published to readers stays a consistent snapshot.
type memHold struct {
	Hold
	hash [16]byte
}

// memState is the region leader's authoritative working copy of its pools, per-user counts,
// holds and idempotency keys, loaded from SQL when it takes leadership (docs/architecture.md, "The region leader's memory"; hot
// path). Only the writer goroutine reads or changes it (before it is handed to the writer, a
// load fills it from one goroutine of its own: region/load.go). Changes made while deciding a batch
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
	// those dropped or archived, under seed, in fixed memory (keyFilter).
	archive bool
	closing []closedAt
	retired keyFilter
	seed    maphash.Seed
	lazyArchive
	stamps
	// keysPer counts the request keys each buyer has used in a sale at this region: every
	// stored hold is one, whole, retired or archived (for a buyer resolved: archive.go), since
	// a key is never forgotten. The writer
	// refuses a new key past Config.MaxKeysPerUser, which bounds what a buyer's retries
	// with fresh keys can make the leader keep.
	keysPer map[saleUser]int32
	// tickets records, for every stored hold made with an admission ticket, the digest of
	// its request key under the digest of (sale, admission), so a ticket backs one request
	// key (useTicket, ticketUsedBy). A hold is archived only once its ticket has expired
	// (archiveCandidatesSQL), and its entry goes with it.
	tickets map[uint64]uint64
	// paused is what admits no new holds (pause.go): replaced, never changed, by the op
	// that changes it, so the leader publishes it to readers as is.
	paused *pauseSet
}

// lazyArchive is what a state knows of the archived holds it has not read: lazy has the
// sales that had archived holds when the state was loaded, whose buyers' archived counts come
// into memory one buyer at a time (resolved, archive.go); archivedSold is, per pool, the sold
// units of archived holds whose buyers are not resolved: a pool's sold units are its buyers'
// bought ones plus these. The writer changes lazy and resolved under memState.mu (readers ask
// mayBeArchived).
type lazyArchive struct {
	lazy         map[string]bool
	resolved     map[saleUser]struct{}
	archivedSold map[poolKey]transfer.Units
}

// stamps are a state's marks for a warm standby (standby.go). changed is at least the highest
// stamp stored in holds.changed: the highest loaded or caught up to, then (in a leader's
// state) the stamp of its last committed batch, holds or none. The writer stamps its next
// batch one higher, so stamps rise with every commit, across leaders too (a new leader loads
// after the old one is fenced). rows counts the holds stored in the holds table (retired ones
// included, archived ones not), as loaded and caught up: a leader's writer does not keep it.
type stamps struct {
	changed int64
	rows    int64
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

// fingerprint decodes a stored request fingerprint (request_hash: 32 hex digits) to the 16
// bytes kept in memory. Anything else is an error naming the hold: a leader that took it as
// some other value would answer that key's retries wrongly.
func fingerprint(holdID string, hexHash []byte) ([16]byte, error) {
	var h [16]byte
	if len(hexHash) != 2*len(h) {
		return h, fmt.Errorf("hold %s: request_hash: %d characters, want %d hex digits", holdID, len(hexHash), 2*len(h))
	}
	if _, err := hex.Decode(h[:], hexHash); err != nil {
		return h, fmt.Errorf("hold %s: request_hash: %w", holdID, err)
	}
	return h, nil
}

// newMemState returns an empty state: no pools, users or holds.
func newMemState() *memState {
	return &memState{pools: map[poolKey]*memPool{}, users: map[userKey]*memUser{}, keysPer: map[saleUser]int32{}, tickets: map[uint64]uint64{}, keys: map[keyKey]*memHold{}, holds: map[string]*memHold{},
		lazyArchive: lazyArchive{lazy: map[string]bool{}, resolved: map[saleUser]struct{}{}, archivedSold: map[poolKey]transfer.Units{}}, seed: maphash.MakeSeed()}
}
