package admission

import (
	"encoding/binary"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// An entry link is how a storefront hands a shopper to a region's waiting-room page without
// the page trusting the browser's word for who the shopper is: the storefront, which has
// authenticated the shopper as it always does, signs (sale, user, expiry) with the cluster's
// ticket keys and sends the browser to /room/{sale}?user=U&exp=T&sig=K.M, where T is the
// expiry in Unix seconds, K the signing key's id and M the unpadded base64url
// HMAC-SHA256 (Keyring.MAC, domain entryDomain) of the length-prefixed sale and user and
// the 8-byte big-endian T. The page enters the line for U only with a link that verifies.
const (
	entryDomain = "quota.room.entry.v1"
	// MaxEntryTTL bounds how far ahead of the verifying region's clock an entry link may
	// expire: a link is for a shopper to follow now, and one that leaks (a browser's history,
	// a log) is good for that long at most.
	MaxEntryTTL = 24 * time.Hour
	// maxEntryExp is the largest exp a link may carry: 9999-12-31T23:59:59Z.
	maxEntryExp = maxExpiresMilli / 1000
	// maxSigLen bounds the sig field: a key id, a dot and a 43-character MAC.
	maxSigLen = maxKeyIDLen + 1 + 43
)

// The query parameters of an entry link.
const (
	EntryUser = "user"
	EntryExp  = "exp"
	EntrySig  = "sig"
)

// EntryLink is what a parsed entry link claims: that the storefront sent User to Sale's waiting
// room, until Expires, signed by the key KeyID. ParseEntry reads it, VerifyEntry checks it.
type EntryLink struct {
	Sale    string
	User    string
	Expires time.Time // whole seconds
	KeyID   string
	mac     [macSize]byte
}

// macSize is the length of an HMAC-SHA256.
const macSize = 32

// SignEntry makes the query of an entry link (user, exp, sig) for user in sale's waiting room,
// expiring at expires (truncated to the second), signed with the keyring's signing key.
// Errors are *apierr.InvalidError naming the bad field.
func (k *Keyring) SignEntry(sale, user string, expires time.Time) (url.Values, error) {
	exp := expires.Unix()
	if err := checkEntryFields(sale, user, exp); err != nil {
		return nil, err
	}
	kid, mac, err := k.MAC(entryDomain, entryMessage(sale, user, exp))
	if err != nil {
		return nil, fmt.Errorf("sign entry link: %w", err)
	}
	return url.Values{EntryUser: {user}, EntryExp: {strconv.FormatInt(exp, 10)},
		EntrySig: {kid + "." + tokenEncoding.EncodeToString(mac)}}, nil
}

// ParseEntry reads an entry link's fields for sale (the path's): user, exp (decimal Unix
// seconds: digits, no leading zero) and sig. It checks their form only; VerifyEntry checks the
// signature and the time. A missing or malformed field is an *apierr.InvalidError naming it.
func ParseEntry(sale, user, exp, sig string) (EntryLink, error) {
	if user == "" {
		return EntryLink{}, apierr.Invalid(EntryUser, "missing: open the waiting room by the link your store gives you")
	}
	if exp == "" || len(exp) > 12 || exp[0] == '0' || strings.Trim(exp, "0123456789") != "" {
		return EntryLink{}, apierr.Invalid(EntryExp, "want the link's expiry in Unix seconds (1 to 12 digits, no leading zero)")
	}
	secs, err := strconv.ParseInt(exp, 10, 64)
	if err != nil { // 12 digits always parse; kept for safety
		return EntryLink{}, apierr.Invalid(EntryExp, "%v", err)
	}
	if err := checkEntryFields(sale, user, secs); err != nil {
		return EntryLink{}, err
	}
	e := EntryLink{Sale: sale, User: user, Expires: time.Unix(secs, 0).UTC()}
	if len(sig) > maxSigLen {
		return EntryLink{}, apierr.Invalid(EntrySig, "is %d bytes, over %d", len(sig), maxSigLen)
	}
	kid, m, ok := strings.Cut(sig, ".")
	if !ok || !validKeyID(kid) {
		return EntryLink{}, apierr.Invalid(EntrySig, "want <key-id>.<base64url MAC>")
	}
	raw, err := tokenEncoding.DecodeString(m)
	if err != nil || len(raw) != macSize || strings.ContainsAny(m, "\r\n") {
		return EntryLink{}, apierr.Invalid(EntrySig, "the MAC is not %d bytes of unpadded base64url", macSize)
	}
	e.KeyID = kid
	copy(e.mac[:], raw)
	return e, nil
}

// checkEntryFields refuses a user that is no printable ASCII of 1 to MaxTicketFieldLen
// bytes, or an expiry before 1970 or after 9999.
func checkEntryFields(sale, user string, exp int64) error {
	if sale == "" || len(sale) > MaxTicketFieldLen {
		return apierr.Invalid("sale_id", "must be 1 to %d bytes", MaxTicketFieldLen)
	}
	if user == "" || len(user) > MaxTicketFieldLen {
		return apierr.Invalid(EntryUser, "must be 1 to %d bytes", MaxTicketFieldLen)
	}
	for i := 0; i < len(user); i++ {
		if c := user[i]; c <= ' ' || c > '~' {
			return apierr.Invalid(EntryUser, "must be printable ASCII with no spaces")
		}
	}
	if exp <= 0 || exp > maxEntryExp {
		return apierr.Invalid(EntryExp, "must be between 1970 and 9999")
	}
	return nil
}

// VerifyEntry checks e: signed by the keyring's key e.KeyID names, not expired at now
// (now >= Expires is expired) and expiring no more than MaxEntryTTL after now. Every
// failure wraps apierr.ErrUnauthenticated with what is wrong ("unknown key k1", "bad
// signature", "expired at ...", "expires ... more than 24h ahead"); none shows a secret.
func (k *Keyring) VerifyEntry(e EntryLink, now time.Time) error {
	if k.index(e.KeyID) < 0 {
		return fmt.Errorf("entry link: unknown key %s (rotated out? ask the store for a new link): %w", e.KeyID, apierr.ErrUnauthenticated)
	}
	if !k.CheckMAC(e.KeyID, entryDomain, entryMessage(e.Sale, e.User, e.Expires.Unix()), e.mac[:]) {
		return fmt.Errorf("entry link: bad signature (a link for another sale or shopper, or altered): %w", apierr.ErrUnauthenticated)
	}
	if !now.Before(e.Expires) {
		return fmt.Errorf("entry link: expired at %s (the server's time is %s): ask the store for a new link: %w",
			e.Expires.Format(time.RFC3339), now.UTC().Format(time.RFC3339), apierr.ErrUnauthenticated)
	}
	if e.Expires.Sub(now) > MaxEntryTTL {
		return fmt.Errorf("entry link: expires at %s, more than %s after the server's time %s: %w",
			e.Expires.Format(time.RFC3339), MaxEntryTTL, now.UTC().Format(time.RFC3339), apierr.ErrUnauthenticated)
	}
	return nil
}

// entryMessage is what an entry link's MAC covers: sale and user, each with a 2-byte length,
// then exp as 8 bytes, all big-endian.
func entryMessage(sale, user string, exp int64) []byte {
	b := make([]byte, 0, 4+len(sale)+len(user)+8)
	b = binary.BigEndian.AppendUint16(b, uint16(len(sale)))
	b = append(b, sale...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(user)))
	b = append(b, user...)
	return binary.BigEndian.AppendUint64(b, uint64(exp))
}
