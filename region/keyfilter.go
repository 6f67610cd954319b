package region

import (
	"math"
	"math/bits"
)

// keyFilter is a Bloom filter of the digests of closed holds' idempotency keys that the
// leader no longer keeps whole (retired or archived: archive.go). Its memory is fixed when it
// is first written to (keyFilterWords words), however many keys go in: a key added is always
// found again (no false negative), and a key never added is found with the probability
// falsePositive gives, which rises with the keys added. A key found costs the reserve one
// indexed SQL lookup of the key (a false positive costs only that); a key not found is new.
type keyFilter struct {
	bits  []uint64
	added int64
}

// keyFilterWords is the filter's size: 2^19 words, 4 MiB, 2^25 bits. With keyFilterHashes
// bits per key, a key never added is found about once in 100,000 times at 1 million keys
// added, once in 100 at 3.5 million, once in 5 at 7.5 million (falsePositive).
const (
	keyFilterWords  = 1 << 19
	keyFilterHashes = 7
	keyFilterBytes  = keyFilterWords * 8
)

// steps are a digest's bit positions by double hashing: the i-th is h1 + i·h2, h2 made odd
// so that it steps through every bit of a power-of-two table.
func steps(d uint64) (h1, h2 uint64) { return d, bits.RotateLeft64(d, 32)*0x9e3779b97f4a7c15 | 1 }

// bitAt is the word and the bit of position p.
func bitAt(p uint64) (int, uint64) {
	p &= keyFilterWords*64 - 1
	return int(p >> 6), 1 << (p & 63)
}

// add records a digest.
func (f *keyFilter) add(d uint64) {
	if f.bits == nil {
		f.bits = make([]uint64, keyFilterWords)
	}
	h1, h2 := steps(d)
	for i := range uint64(keyFilterHashes) {
		w, b := bitAt(h1 + i*h2)
		f.bits[w] |= b
	}
	f.added++
}

// has tells whether a digest may have been added: always true for one that was.
func (f *keyFilter) has(d uint64) bool {
	if f.bits == nil {
		return false
	}
	h1, h2 := steps(d)
	for i := range uint64(keyFilterHashes) {
		if w, b := bitAt(h1 + i*h2); f.bits[w]&b == 0 {
			return false
		}
	}
	return true
}

// falsePositive is the chance that a digest never added is found, with the keys added so
// far: (1 − e^(−k·n/m))^k.
func (f *keyFilter) falsePositive() float64 {
	m := float64(keyFilterWords * 64)
	return math.Pow(1-math.Exp(-keyFilterHashes*float64(f.added)/m), keyFilterHashes)
}
