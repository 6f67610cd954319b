package admission

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Limiter is a set of token buckets keyed by a string (a user id, a client address), each
// holding up to burst tokens and earning rate tokens a second; Allow spends one. The caller
// passes the time. It is safe for concurrent use.
//
// A bucket is kept as the time it will be full again (its theoretical arrival time, as in
// GCRA), so the arithmetic is exact integer nanoseconds and a bucket that is full is the
// same as no bucket at all. That is what bounds the table: it holds at most maxKeys buckets,
// and when a new key finds it full, the buckets that have refilled are dropped (losing
// nothing). If none has, the limiter fails closed: the new key is refused, with the time
// until the first bucket refills as its retry-after, and the table never grows past maxKeys.
// So at most maxKeys keys can be partly spent at once; size it above the keys that are
// active within burst/rate.
type Limiter struct {
	mu        sync.Mutex
	interval  time.Duration        // time to earn one token: 1/rate
	capacity  time.Duration        // burst × interval: how far past now a bucket's time may run
	maxKeys   int                  // bound on len(full)
	full      map[string]time.Time // key → when its bucket is full again; always after it was last used
	nextSweep time.Time            // no bucket in full is full again before this time
}

// maxBurst bounds a bucket's size, so its capacity in time never saturates.
const maxBurst = 1 << 30

// NewLimiter makes a limiter whose buckets earn rate tokens a second (at most 1e9; a rate so
// low that burst tokens take over 146 years is taken as that) and hold up to burst, for at
// most maxKeys keys at once. It panics unless rate > 0 and finite, 1 <= burst <= 2^30 and
// maxKeys >= 1: these are configuration, checked before.
func NewLimiter(rate float64, burst int, maxKeys int) *Limiter {
	if !(rate > 0) || math.IsInf(rate, 0) || burst < 1 || burst > maxBurst || maxKeys < 1 {
		panic(fmt.Sprintf("admission.NewLimiter(%v, %d, %d): want rate > 0, 1 <= burst <= 2^30, maxKeys >= 1",
			rate, burst, maxKeys))
	}
	// capacity + interval must stay below the largest Duration, so that a bucket one
	// token past capacity never saturates Sub into looking within it.
	longest := time.Duration(math.MaxInt64/2) / time.Duration(burst)
	interval := longest
	if ns := math.Round(float64(time.Second) / rate); ns < float64(longest) {
		interval = max(time.Duration(ns), 1)
	}
	return &Limiter{
		interval: interval, capacity: interval * time.Duration(burst), maxKeys: maxKeys,
		full: make(map[string]time.Time),
	}
}

// Allow spends one of key's tokens at now and reports whether it had one. If not, retryAfter
// is how long until it will: until key's next token for a known key, or, when key is new and
// the table is full of buckets that have not refilled, until the first of them refills (the
// limiter fails closed rather than grow; another new key may take that place first).
func (l *Limiter) Allow(key string, now time.Time) (ok bool, retryAfter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, known := l.full[key]
	if !known {
		if len(l.full) >= l.maxKeys && !l.makeRoom(now) {
			return false, l.nextSweep.Sub(now)
		}
		at = now
	}
	if at.Before(now) {
		at = now // the bucket is full: tokens beyond burst are not kept
	}
	next := at.Add(l.interval)
	if ahead := next.Sub(now); ahead > l.capacity {
		return false, ahead - l.capacity
	}
	l.full[key] = next
	if !known && next.Before(l.nextSweep) {
		l.nextSweep = next
	}
	return true, 0
}

// makeRoom drops the buckets that are full again at now and reports whether the table has
// room. It does nothing before nextSweep, when no bucket can have refilled (a bucket's time
// only moves later), so a full table refuses a flood of new keys at O(1) each.
func (l *Limiter) makeRoom(now time.Time) bool {
	if now.Before(l.nextSweep) {
		return false
	}
	var earliest time.Time
	for key, at := range l.full {
		if !at.After(now) {
			delete(l.full, key)
			continue
		}
		if earliest.IsZero() || at.Before(earliest) {
			earliest = at
		}
	}
	l.nextSweep = earliest
	return len(l.full) < l.maxKeys
}

// Len is how many buckets the limiter holds, at most maxKeys.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.full)
}
