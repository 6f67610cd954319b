package region

import (
	"fmt"
	"hash/maphash"
	"time"
)

// A closed hold (sold, released, expired) never changes again, so neither the leader's
// memory nor the holds table need keep it for long:
//
//   - Retired: once it has been closed for Config.Sweep.RetainClosed (counted from its closed_at,
//     also for the holds a leader loads), the leader drops it from memory and keeps only its
//     key's digest, in a Bloom filter of fixed size (keyFilter).
//   - Archived: the archiver (archiveOp, run by the sweeper) then moves it from holds to
//     holds_closed, in bounded batches, in one transaction of the writer that also adds it to
//     its buyer's row of archived_users and its pool's row of archived_pools. A takeover reads
//     holds and archived_pools, never holds_closed or archived_users, so it costs the same
//     whatever the history.
//
// What a closed hold still decides is read from SQL, from both tables:
//
//   - a reserve whose key the filter may have looks the key up (a retry is answered with its
//     hold, a reuse with ALREADY_EXISTS, a false positive goes on as new);
//   - a confirm or release of a hold not in memory reads the hold and is decided on that
//     stored, closed hold by the writer (I5, I6 as before: a closed hold never reopens).
//
// Per-buyer counts (I2: a buyer's held plus bought units, and the request keys a buyer has
// used) are sums over the buyer's holds, archived ones included. A sale with an archive when
// the state was loaded is lazy (memState.lazy): its buyers' archived counts are not in memory
// until the writer first needs them, and a buyer's row of archived_users and archived keys
// are then read (readBuyers) and added (resolve) before anything is decided for that buyer.
// A buyer's archived rows change only when the writer archives one of the buyer's holds, and
// the archiver resolves every buyer whose holds it moves in the same batch, so the rows of a
// buyer the writer does not know do not change under it while it leads from one state.
// The sold units of archived holds of buyers not yet resolved are kept per pool
// (memState.archivedSold), so a pool's sold units are still the sum over its buyers'.

// errHoldNotInMemory is the writer's answer for a hold id it does not have in memory: the
// hold may be closed and retired, so the caller reads it from SQL and asks again with it.
// It is also a NOT_FOUND, which is what a Core (which never retires) means by it.
var errHoldNotInMemory = fmt.Errorf("hold not in memory: %w", ErrNotFound)

// closedAt is a committed closed hold the leader still keeps whole, and when it closed.
type closedAt struct {
	at time.Time
	id string
}

// retireBatch bounds the holds one commit retires, so the writer never pauses long for it.
const retireBatch = 4096

// keyDigest is the in-memory trace of a retired or archived hold's idempotency key.
func (m *memState) keyDigest(k keyKey) uint64 { return maphash.Comparable(m.seed, k) }

// mayBeArchived tells whether k may be the key of a hold no longer in memory: its digest is in
// the filter, or its buyer's archived holds are not in memory yet. Safe from any goroutine.
func (m *memState) mayBeArchived(k keyKey) bool {
	if !m.archive {
		return false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return !m.knowsBuyer(k.sale, k.user) || m.retiredKey(k)
}

// lookupFor tells what a reserve of key k needs read from SQL before the writer can decide
// it, as this committed state stands (a reader's answer, under mu; the writer checks again).
func (m *memState) lookupFor(k keyKey) lookup {
	if !m.archive {
		return lookupNone
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	switch {
	case !m.knowsBuyer(k.sale, k.user):
		return lookupBuyer
	case m.retiredKey(k):
		return lookupKey
	}
	return lookupNone
}

// retiredKey tells whether k may be a retired or archived hold's key, for the writer (which
// alone changes the filter) or a caller holding mu.
func (m *memState) retiredKey(k keyKey) bool { return m.retired.has(m.keyDigest(k)) }

// knowsBuyer tells whether the buyer's counts in memory include the buyer's archived holds:
// always, but in a lazy sale for a buyer not yet resolved. The writer, or a caller holding mu.
func (m *memState) knowsBuyer(sale, user string) bool {
	if !m.lazy[sale] {
		return true
	}
	_, ok := m.resolved[saleUser{sale, user}]
	return ok
}

// retire drops a closed hold from memory, keeping its key's digest; the caller holds mu or
// owns m. I5 is unaffected: the stored hold stays closed and a closed hold is decided from it.
func (m *memState) retire(h *memHold) {
	if h.State == Held {
		panic(fmt.Sprintf("region: retire live hold %s", h.ID)) // only closed holds are queued: a programmer error
	}
	k := keyKey{h.Sale, h.User, h.RequestKey}
	delete(m.holds, h.ID)
	if m.keys[k] == h {
		delete(m.keys, k)
	}
	m.retireKey(k)
}

// retireKey puts k's digest in the filter, once.
func (m *memState) retireKey(k keyKey) {
	if d := m.keyDigest(k); !m.retired.has(d) {
		m.retired.add(d)
	}
}

// retireClosed retires the committed closed holds that closed at or before cutoff, oldest
// first, at most retireBatch of them. Only the writer calls it, after a commit.
func (m *memState) retireClosed(cutoff time.Time) {
	if !m.archive || len(m.closing) == 0 || m.closing[0].at.After(cutoff) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for n < retireBatch && len(m.closing) > 0 && !m.closing[0].at.After(cutoff) {
		if h := m.holds[m.closing[0].id]; h != nil && h.State != Held {
			m.retire(h)
		}
		m.closing = m.closing[1:]
		n++
	}
}

type saleAdmission struct{ sale, admission string }

// useTicket records that h's admission ticket backs h's request key: a ticket backs at most
// one request key (with I6, one hold), durable with the hold (holds.admission_id, unique).
func (m *memState) useTicket(h Hold) {
	if h.Admission != "" {
		m.tickets[maphash.Comparable(m.seed, saleAdmission{h.Sale, h.Admission})] = maphash.String(m.seed, h.RequestKey)
	}
}

// ticketUsedBy reports whether sale's admission already backs a hold with a request key
// other than key (a digest collision of two keys would let the second through; the unique
// index on holds (sale_id, admission_id) refuses it at the commit).
func (m *memState) ticketUsedBy(sale, admission, key string) bool {
	used, ok := m.tickets[maphash.Comparable(m.seed, saleAdmission{sale, admission})]
	return ok && used != maphash.String(m.seed, key)
}
