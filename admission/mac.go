package admission

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
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
	key := k.keys[0]
	return key.id, domainMAC(key, domain, msg), nil
}

// CheckMAC reports whether mac is the MAC of domain and msg under the key named keyID, in
// constant time; false for a key the keyring does not hold.
func (k *Keyring) CheckMAC(keyID, domain string, msg, mac []byte) bool {
	key, ok := k.lookup(keyID)
	if !ok || !validDomain(domain) {
		return false
	}
	return hmac.Equal(mac, domainMAC(key, domain, msg))
}

func validDomain(d string) bool {
	for i := 0; i < len(d); i++ {
		if d[i] == 0 {
			return false
		}
	}
	return d != ""
}

func domainMAC(key ringKey, domain string, msg []byte) []byte {
	m := hmac.New(sha256.New, key.secret[:])
	m.Write([]byte(domain))
	m.Write([]byte{0})
	m.Write(msg)
	return m.Sum(nil)
}
