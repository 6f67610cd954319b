package admission

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"hash"
	"sync"
)

// The keyring's keys also sign things other than tickets (the coordinator console's login
// tokens, from a key file of their own): MAC and CheckMAC compute HMAC-SHA256 over a domain
// string and the message, so a MAC made for one use never verifies for another, nor as a
// ticket's (whose MAC covers the bare payload, which starts with a version byte).

// MAC is HMAC-SHA256 of domain, a zero byte and msg under the signing key, and that key's id.
// domain must be non-empty and hold no zero byte.
func (k *Keyring) MAC(domain string, msg []byte) (keyID string, mac []byte, err error) {
	if k == nil || len(k.keys) == 0 {
		return "", nil, errors.New("mac: the keyring has no key")
	}
	if !validDomain(domain) {
		return "", nil, errors.New("mac: bad domain")
	}
	return k.keys[0].id, k.domainMAC(0, domain, msg), nil
}

// CheckMAC reports whether mac is the MAC of domain and msg under the key named keyID, in
// constant time; false for a key the keyring does not hold.
func (k *Keyring) CheckMAC(keyID, domain string, msg, mac []byte) bool {
	i := k.index(keyID)
	if i < 0 || !validDomain(domain) {
		return false
	}
	return hmac.Equal(mac, k.domainMAC(i, domain, msg))
}

func validDomain(d string) bool {
	for i := 0; i < len(d); i++ {
		if d[i] == 0 {
			return false
		}
	}
	return d != ""
}

// domainMAC is HMAC-SHA256 of domain, a zero byte and msg under k.keys[i].
func (k *Keyring) domainMAC(i int, domain string, msg []byte) []byte {
	m := k.mac(i)
	defer k.done(i, m)
	m.h.Write([]byte(domain))
	m.h.Write([]byte{0})
	m.h.Write(msg)
	return m.h.Sum(nil)
}

// keyedMAC is an HMAC-SHA256 keyed with one ring key, and room for a sum. hmac.New costs
// two SHA-256 states and the key's two pads each time, and hashes a block of each pad for
// every MAC; a keyed MAC reset for reuse starts again from the pads' saved states.
type keyedMAC struct {
	h   hash.Hash
	sum [sha256.Size]byte
}

// newMACPool is the pool of MACs keyed with secret that a keyring keeps (Keyring.macs).
func newMACPool(secret [secretSize]byte) *sync.Pool {
	return &sync.Pool{New: func() any { return &keyedMAC{h: hmac.New(sha256.New, secret[:])} }}
}

// mac is an HMAC-SHA256 keyed with k.keys[i], as new: from the key's pool when the keyring
// keeps one. Give it back with done once its sum is read.
func (k *Keyring) mac(i int) *keyedMAC {
	if i >= len(k.macs) {
		return &keyedMAC{h: hmac.New(sha256.New, k.keys[i].secret[:])}
	}
	m := k.macs[i].Get().(*keyedMAC)
	m.h.Reset()
	return m
}

// done gives m, from mac(i), back to the pool of k.keys[i].
func (k *Keyring) done(i int, m *keyedMAC) {
	if i < len(k.macs) {
		k.macs[i].Put(m)
	}
}
