package region

import (
	"errors"
	"fmt"
	"hash/maphash"
	"time"
)

// A closed hold (sold, released, expired) never changes again, so the leader need not keep
// it whole: once it has been closed for Config.RetainClosed (counted from its closed_at,
// also for the holds a leader loads), the leader drops it from memory and keeps only a
// 64-bit digest of its idempotency key, for as long as it leads. The leader's memory then
// grows with the live holds, not with every hold ever made. What a closed hold still decides
// is read from SQL:
//
//   - a reserve whose key's digest is retired looks the key up in SQL (a retry is answered
//     with its hold, a reuse with ALREADY_EXISTS, and a digest collision goes on as new);
//   - a confirm or release of a hold not in memory reads the hold from SQL and is decided on
//     that stored, closed hold by the writer (I5, I6 as before: a closed hold never reopens).
//
// Per-user counts stay whole in memory (they are sums over held and sold holds, I2).

// errHoldNotInMemory is the writer's answer for a hold id it does not have in memory: the
// hold may be closed and retired, so the caller reads it from SQL and asks again with it.
// It is also a NOT_FOUND, which is what a Core (which never retires) means by it.
var errHoldNotInMemory = fmt.Errorf("hold not in memory: %w", ErrNotFound)

// errKeyRetired is the writer's answer for a reserve whose idempotency key may belong to a
// retired hold: the caller looks the key up in SQL before the reserve goes on.
var errKeyRetired = errors.New("idempotency key of a retired hold")

// closedAt is a committed closed hold the leader still keeps whole, and when it closed.
type closedAt struct {
	at time.Time
	id string
}

// retireBatch bounds the holds one commit retires, so the writer never pauses long for it.
const retireBatch = 4096

// keyDigest is the in-memory trace of a retired hold's idempotency key.
func (m *memState) keyDigest(k keyKey) uint64 { return maphash.Comparable(m.seed, k) }

// isRetired tells whether k may be the key of a retired hold; safe from any goroutine.
func (m *memState) isRetired(k keyKey) bool {
	if !m.archive {
		return false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.retiredKey(k)
}

// retiredKey is isRetired for the writer, which alone changes retired: no lock.
func (m *memState) retiredKey(k keyKey) bool {
	if len(m.retired) == 0 {
		return false
	}
	_, ok := m.retired[m.keyDigest(k)]
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
	m.retired[m.keyDigest(k)] = struct{}{}
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
