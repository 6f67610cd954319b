package admission

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"
)

const (
	// maxRingKeys is how many keys a key file holds: the signing key and the one before it,
	// two accepted at once so keys rotate without downtime.
	maxRingKeys = 2
	// secretSize is the length of a key's secret in bytes (HMAC-SHA256 wants 32).
	secretSize = 32
	// maxKeyIDLen bounds a key id, which every ticket carries.
	maxKeyIDLen = 32
	// maxKeyFileSize bounds what ParseKeyring reads; a real file is a few hundred bytes.
	maxKeyFileSize = 64 << 10
	// newKeyIDBytes is how many random bytes name a fresh key ("k" and 8 hex digits).
	newKeyIDBytes = 4
)

// keyFileHeader opens every key file NewKeyFile and RotateKeyFile write.
const keyFileHeader = `# Admission ticket keys for one cluster, read by admission.ParseKeyring.
# Each key is one line "<key-id> <secret>": the id is 1 to 32 characters of A-Z a-z 0-9 _ -,
# the secret is 32 random bytes in standard base64. Blank lines and lines starting with #
# are ignored. The first key signs new tickets; every key here (at most 2) verifies them.
# To rotate, put a fresh key first and keep the old signing key second until the tickets
# it signed have expired (admission.RotateKeyFile does this). Keep this file secret:
# whoever reads it can sign tickets.
`

// ringKey is one key: its public id and its secret, which no error or String shows.
type ringKey struct {
	id     string
	secret [secretSize]byte
}

// Keyring holds a cluster's ticket keys: the first signs, each (at most 2) verifies. It is
// immutable once parsed and safe for concurrent use. It prints as its key ids only, never
// its secrets, whatever the format verb.
type Keyring struct {
	keys []ringKey // keys[0] signs; 1 or 2 keys with distinct ids
	// macs[i] holds HMACs keyed with keys[i], for reuse (mac.go); a keyring without them
	// keys each MAC anew.
	macs []*sync.Pool
}

// ParseKeyring reads a key file: UTF-8 text, one key a line as "<key-id> <secret>" with the
// secret a standard-base64 32-byte value; blank lines and lines starting with '#' are
// ignored, and so is a leading byte-order mark. The first key signs and every key (1 or 2)
// verifies. Errors name the line and what is wrong with it, never the secret.
func ParseKeyring(data []byte) (*Keyring, error) {
	if len(data) > maxKeyFileSize {
		return nil, fmt.Errorf("key file: %d bytes, over the %d-byte limit", len(data), maxKeyFileSize)
	}
	text := strings.TrimPrefix(string(data), "\ufeff")
	k := &Keyring{}
	firstLine := map[string]int{} // key id → line it is on
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		if !utf8.ValidString(line) {
			return nil, fmt.Errorf("key file: line %d: not UTF-8", n)
		}
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := parseKeyLine(line)
		if err != nil {
			return nil, fmt.Errorf("key file: line %d: %w", n, err)
		}
		if at, dup := firstLine[key.id]; dup {
			return nil, fmt.Errorf("key file: line %d: duplicate key id %s (first on line %d)", n, key.id, at)
		}
		if len(k.keys) == maxRingKeys {
			return nil, fmt.Errorf("key file: line %d: more than %d keys (the signing key and the one before it)",
				n, maxRingKeys)
		}
		firstLine[key.id] = n
		k.keys = append(k.keys, key)
		k.macs = append(k.macs, newMACPool(key.secret))
	}
	if len(k.keys) == 0 {
		return nil, errors.New("key file: no key (want lines of \"<key-id> <base64 secret>\")")
	}
	return k, nil
}

// parseKeyLine reads one "<key-id> <secret>" line. Its errors never quote the line, whose
// words may be the secret (a line with the id left out, say).
func parseKeyLine(line string) (ringKey, error) {
	words := strings.Fields(line)
	if len(words) != 2 {
		return ringKey{}, fmt.Errorf("want \"<key-id> <base64 secret>\", got %d words", len(words))
	}
	if !validKeyID(words[0]) {
		return ringKey{}, fmt.Errorf("bad key id: want 1 to %d characters of A-Z a-z 0-9 _ -", maxKeyIDLen)
	}
	secret, err := base64.StdEncoding.Strict().DecodeString(words[1])
	if err != nil {
		return ringKey{}, errors.New("secret is not standard base64")
	}
	if len(secret) != secretSize {
		return ringKey{}, fmt.Errorf("secret is %d bytes, want %d", len(secret), secretSize)
	}
	key := ringKey{id: words[0]}
	copy(key.secret[:], secret)
	return key, nil
}

// validKeyID reports whether id is 1..32 characters of [A-Za-z0-9_-].
func validKeyID(id string) bool {
	if id == "" || len(id) > maxKeyIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// NewKeyFile makes a key file holding one fresh key, read from rand (crypto/rand.Reader in
// production): an id of "k" and 8 random hex digits and a 32-byte secret, under a comment
// header that explains the format.
func NewKeyFile(rand io.Reader) ([]byte, error) {
	key, err := newKey(rand, "")
	if err != nil {
		return nil, err
	}
	return formatKeyFile([]ringKey{key}), nil
}

// RotateKeyFile rotates the key file old: a fresh key (read from rand) first, so it signs;
// old's signing key second, so the tickets it signed still verify; any older key dropped.
// The output is a whole new file with the comment header; old's comments are not kept.
func RotateKeyFile(old []byte, rand io.Reader) ([]byte, error) {
	k, err := ParseKeyring(old)
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	key, err := newKey(rand, k.keys[0].id)
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	return formatKeyFile([]ringKey{key, k.keys[0]}), nil
}

// newKey reads a fresh key from rand whose id is not avoid.
func newKey(rand io.Reader, avoid string) (ringKey, error) {
	if rand == nil {
		return ringKey{}, errors.New("new key: no random source")
	}
	for range 4 {
		var buf [newKeyIDBytes + secretSize]byte
		if _, err := io.ReadFull(rand, buf[:]); err != nil {
			return ringKey{}, fmt.Errorf("new key: reading random bytes: %w", err)
		}
		key := ringKey{id: "k" + hex.EncodeToString(buf[:newKeyIDBytes])}
		copy(key.secret[:], buf[newKeyIDBytes:])
		if key.secret == [secretSize]byte{} {
			return ringKey{}, errors.New("new key: the random source gave all zeros")
		}
		if key.id != avoid {
			return key, nil
		}
	}
	return ringKey{}, fmt.Errorf("new key: the random source gave the id %s 4 times", avoid)
}

// formatKeyFile writes keys as a key file, signing key first.
func formatKeyFile(keys []ringKey) []byte {
	var b strings.Builder
	b.WriteString(keyFileHeader)
	for _, key := range keys {
		b.WriteString(key.id)
		b.WriteByte(' ')
		b.WriteString(base64.StdEncoding.EncodeToString(key.secret[:]))
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// SigningKeyID names the key that signs new tickets (the file's first).
func (k *Keyring) SigningKeyID() string {
	if k == nil || len(k.keys) == 0 {
		return ""
	}
	return k.keys[0].id
}

// IDs lists the ids of the keys that verify tickets, the signing key first.
func (k *Keyring) IDs() []string {
	if k == nil {
		return nil
	}
	ids := make([]string, len(k.keys))
	for i, key := range k.keys {
		ids[i] = key.id
	}
	return ids
}

// lookup finds the key named id.
func (k *Keyring) lookup(id string) (ringKey, bool) {
	if i := k.index(id); i >= 0 {
		return k.keys[i], true
	}
	return ringKey{}, false
}

// index is the position in k.keys of the key named id, -1 if none.
func (k *Keyring) index(id string) int {
	if k == nil {
		return -1
	}
	for i, key := range k.keys {
		if key.id == id {
			return i
		}
	}
	return -1
}

// String names the keys, signing key first, as "keyring(sign k1, verify k1 k0)"; it never
// shows a secret.
func (k Keyring) String() string {
	ids := k.IDs()
	if len(ids) == 0 {
		return "keyring(empty)"
	}
	return "keyring(sign " + ids[0] + ", verify " + strings.Join(ids, " ") + ")"
}

// Format prints the keyring as String does for every verb (%v, %+v, %#v, %x, %d, ...), so no
// way of printing it shows a secret.
func (k Keyring) Format(f fmt.State, _ rune) {
	_, _ = io.WriteString(f, k.String())
}
