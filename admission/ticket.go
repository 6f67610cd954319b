package admission

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// A token is "v1." + base64url(payload) + "." + base64url(HMAC-SHA256(secret, payload)), both
// unpadded. The payload is the version byte 1 and then, each as a 2-byte big-endian length
// and its bytes: Sale, User, Region, Admission, SKU, Expires (8 bytes: big-endian unix
// milliseconds) and KeyID. Every ticket has exactly one payload, and every payload one token.
const (
	tokenPrefix    = "v1."
	payloadVersion = 1
	// MaxTokenLen bounds a token; Verify refuses a longer one before decoding it. The largest
	// ticket Sign accepts makes a token of under 1,000 bytes.
	MaxTokenLen = 2048
	// MaxTicketFieldLen bounds each of a ticket's Sale, User, Region, Admission and SKU, in
	// bytes.
	MaxTicketFieldLen = 128
	// payloadFields is how many length-prefixed fields follow the version byte.
	payloadFields = 7
	// maxExpiresMilli is 9999-12-31T23:59:59.999Z, the latest expiry a ticket may carry.
	maxExpiresMilli = 253402300799999
)

// tokenEncoding is unpadded base64url that refuses non-zero padding bits, so no two texts
// decode to the same bytes (Verify refuses the CR and LF it would skip before decoding).
var tokenEncoding = base64.RawURLEncoding.Strict()

// Sign makes the token for t: it sets t.KeyID to the signing key's id and MACs the canonical
// encoding of t (Expires is kept to the millisecond, so a verified ticket's Expires is t's
// truncated). Sale, User, Region and Admission must be set, each field at most
// MaxTicketFieldLen bytes, and Expires set (between 1970 and 9999); otherwise the error is an
// *apierr.InvalidError naming the field.
func (k *Keyring) Sign(t Ticket) (string, error) {
	if k == nil || len(k.keys) == 0 {
		return "", errors.New("sign ticket: the keyring has no key")
	}
	t.KeyID = k.keys[0].id
	if field, reason := checkTicket(t); field != "" {
		return "", apierr.Invalid("ticket "+field, "%s", reason)
	}
	payload := encodePayload(t)
	var mac [sha256.Size]byte
	k.ticketMAC(0, payload, &mac)
	return tokenPrefix + tokenEncoding.EncodeToString(payload) + "." + tokenEncoding.EncodeToString(mac[:]), nil
}

// Verify checks token and returns its ticket: well formed, at most MaxTokenLen bytes, signed
// by the keyring's key its KeyID names, and not expired at now (now >= Expires is expired).
// Every failure wraps ErrTicketInvalid with what is wrong ("malformed: ...", "unknown key
// k1", "bad signature", "expired at ..."); no error shows a secret. Verify does not check
// what the ticket is for (Check does) nor whether it was used.
func (k *Keyring) Verify(token string, now time.Time) (Ticket, error) {
	tok, err := ParseToken(token)
	if err != nil {
		return Ticket{}, err
	}
	return k.VerifyToken(tok, now)
}

// VerifyToken is Verify of a token already read (ParseToken): the same checks and answers
// as Verify(tok.Text(), now), without reading the token again.
func (k *Keyring) VerifyToken(tok *Token, now time.Time) (Ticket, error) {
	t, err := k.VerifySignature(tok)
	if err != nil {
		return Ticket{}, err
	}
	if err := t.CheckLive(now); err != nil {
		return Ticket{}, err
	}
	return t, nil
}

// VerifySignature checks that tok is signed by the keyring's key its KeyID names, and nothing
// else: not its expiry (CheckLive) nor what it is for (Check). Its errors are VerifyToken's
// ("unknown key k1", "bad signature"). Only a ticket that passed it says whose it is.
func (k *Keyring) VerifySignature(tok *Token) (Ticket, error) {
	t := tok.Ticket
	i := k.index(t.KeyID)
	if i < 0 {
		return Ticket{}, ticketInvalid("unknown key %s", t.KeyID)
	}
	if !k.checkTicketMAC(i, tok.payload, tok.sig[:]) {
		return Ticket{}, ticketInvalid("bad signature")
	}
	return t, nil
}

// CheckLive reports whether t is unexpired at now (now >= Expires is expired): nil if so, else
// an error wrapping ErrTicketInvalid saying when it expired.
func (t Ticket) CheckLive(now time.Time) error {
	if !now.Before(t.Expires) {
		return ticketInvalid("expired at %s", t.Expires.Format("2006-01-02T15:04:05.000Z07:00"))
	}
	return nil
}

// Check reports whether t is for this sale, user and region: nil if so, else an error
// wrapping ErrTicketInvalid that names the first field that differs.
func (t Ticket) Check(sale, user, region string) error {
	switch {
	case t.Sale != sale:
		return ticketInvalid("ticket is for sale %q, not %q", t.Sale, sale)
	case t.User != user:
		return ticketInvalid("ticket is for user %q, not %q", t.User, user)
	case t.Region != region:
		return ticketInvalid("ticket is for region %q, not %q", t.Region, region)
	}
	return nil
}

// ticketInvalid wraps ErrTicketInvalid with a reason.
func ticketInvalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTicketInvalid, fmt.Sprintf(format, args...))
}

// ticketMAC puts HMAC-SHA256 of payload under k.keys[i] in out.
func (k *Keyring) ticketMAC(i int, payload []byte, out *[sha256.Size]byte) {
	m := k.mac(i)
	defer k.done(i, m)
	m.h.Write(payload)
	copy(out[:], m.h.Sum(m.sum[:0]))
}

// checkTicketMAC reports whether sig is HMAC-SHA256 of payload under k.keys[i], in constant
// time.
func (k *Keyring) checkTicketMAC(i int, payload, sig []byte) bool {
	m := k.mac(i)
	defer k.done(i, m)
	m.h.Write(payload)
	return hmac.Equal(sig, m.h.Sum(m.sum[:0]))
}

// checkTicket names the first field of t that Sign would refuse and why; "" if none.
func checkTicket(t Ticket) (field, reason string) {
	required := []struct{ name, value string }{
		{"sale", t.Sale}, {"user", t.User}, {"region", t.Region}, {"admission", t.Admission}, {"sku", t.SKU},
	}
	for _, f := range required {
		switch {
		case f.value == "" && f.name != "sku":
			return f.name, "is empty"
		case len(f.value) > MaxTicketFieldLen:
			return f.name, fmt.Sprintf("is %d bytes, over %d", len(f.value), MaxTicketFieldLen)
		}
	}
	if !validKeyID(t.KeyID) {
		return "key id", fmt.Sprintf("is not 1 to %d characters of A-Z a-z 0-9 _ -", maxKeyIDLen)
	}
	if t.Expires.IsZero() {
		return "expires", "is not set"
	}
	if ms := t.Expires.UnixMilli(); ms <= 0 || ms > maxExpiresMilli {
		return "expires", "is not between 1970 and 9999"
	}
	return "", ""
}

// encodePayload is the canonical encoding of t that the MAC covers.
func encodePayload(t Ticket) []byte {
	b := make([]byte, 0, 1+2*payloadFields+len(t.Sale)+len(t.User)+len(t.Region)+
		len(t.Admission)+len(t.SKU)+8+len(t.KeyID))
	b = append(b, payloadVersion)
	for _, s := range []string{t.Sale, t.User, t.Region, t.Admission, t.SKU} {
		b = appendField(b, s)
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.Expires.UnixMilli()))
	b = appendField(b, string(ms[:]))
	return appendField(b, t.KeyID)
}

// appendField appends s with its 2-byte big-endian length.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// Token is a ticket's token as read (ParseToken), before its signature is checked: what it
// says, and what VerifyToken checks it with. Read once, a token serves both the caller that
// wants to know whose it is (Peek) and the region that verifies it.
type Token struct {
	// Ticket is what the token says; trust it only once VerifyToken has passed.
	Ticket  Ticket
	text    string
	payload []byte
	sig     [sha256.Size]byte
}

// Text is the token ParseToken read.
func (t *Token) Text() string { return t.text }

// ParseToken reads token: its form only (as Verify does first, with the same errors), not
// its signature or expiry; VerifyToken checks those.
func ParseToken(token string) (*Token, error) {
	switch {
	case token == "":
		return nil, ticketInvalid("malformed: empty token")
	case len(token) > MaxTokenLen:
		return nil, ticketInvalid("malformed: token is %d bytes, over %d", len(token), MaxTokenLen)
	case !strings.HasPrefix(token, tokenPrefix):
		return nil, ticketInvalid("malformed: not a v1 token")
	}
	for i := 0; i < len(token); i++ {
		if !isTokenByte(token[i]) {
			return nil, ticketInvalid("malformed: byte %d is not base64url or '.'", i)
		}
	}
	body, sigText, ok := strings.Cut(token[len(tokenPrefix):], ".")
	if !ok || strings.Contains(sigText, ".") {
		return nil, ticketInvalid("malformed: want 3 parts separated by '.'")
	}
	tok := &Token{text: token}
	raw := []byte(token[len(tokenPrefix):]) // one copy of both parts, which the decoder wants as bytes
	payload, err := tokenEncoding.AppendDecode(nil, raw[:len(body)])
	if err != nil {
		return nil, ticketInvalid("malformed: payload is not base64url")
	}
	if err := decodeSig(tok, raw[len(body)+1:]); err != nil {
		return nil, err
	}
	if tok.Ticket, err = decodePayload(payload); err != nil {
		return nil, err
	}
	tok.payload = payload
	return tok, nil
}

// decodeSig decodes a token's signature part into tok.sig: it must be base64url of exactly
// sha256.Size bytes.
func decodeSig(tok *Token, text []byte) error {
	if len(text) == tokenEncoding.EncodedLen(sha256.Size) {
		if _, err := tokenEncoding.Decode(tok.sig[:], text); err != nil {
			return ticketInvalid("malformed: signature is not base64url")
		}
		return nil
	}
	sig, err := tokenEncoding.AppendDecode(nil, text)
	if err != nil {
		return ticketInvalid("malformed: signature is not base64url")
	}
	return ticketInvalid("malformed: signature is %d bytes, want %d", len(sig), sha256.Size)
}

// isTokenByte reports whether c may appear in a token: base64url or the '.' separator.
func isTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}

// decodePayload reads a payload encodePayload wrote, and refuses one Sign would not make.
func decodePayload(p []byte) (Ticket, error) {
	if len(p) == 0 || p[0] != payloadVersion {
		return Ticket{}, ticketInvalid("malformed: unknown payload version")
	}
	p = p[1:]
	var fields [payloadFields][]byte
	for i := range fields {
		if len(p) < 2 {
			return Ticket{}, ticketInvalid("malformed: payload ends inside field %d", i+1)
		}
		n := int(binary.BigEndian.Uint16(p))
		p = p[2:]
		if len(p) < n {
			return Ticket{}, ticketInvalid("malformed: payload ends inside field %d", i+1)
		}
		fields[i], p = p[:n], p[n:]
	}
	if len(p) != 0 {
		return Ticket{}, ticketInvalid("malformed: %d bytes after the last field", len(p))
	}
	if len(fields[5]) != 8 {
		return Ticket{}, ticketInvalid("malformed: expiry is %d bytes, want 8", len(fields[5]))
	}
	ms := int64(binary.BigEndian.Uint64(fields[5]))
	if ms <= 0 || ms > maxExpiresMilli {
		return Ticket{}, ticketInvalid("malformed: expiry is not between 1970 and 9999")
	}
	// One string holds every field (one allocation, not one a field).
	var b strings.Builder
	b.Grow(len(fields[0]) + len(fields[1]) + len(fields[2]) + len(fields[3]) + len(fields[4]) + len(fields[6]))
	var str [payloadFields]string
	for i, f := range fields {
		if i != 5 {
			b.Write(f)
			str[i] = b.String()[b.Len()-len(f):]
		}
	}
	t := Ticket{
		Sale: str[0], User: str[1], Region: str[2], Admission: str[3], SKU: str[4],
		Expires: time.UnixMilli(ms).UTC(), KeyID: str[6],
	}
	if field, reason := checkTicket(t); field != "" {
		return Ticket{}, ticketInvalid("malformed: %s %s", field, reason)
	}
	return t, nil
}

// Peek reads what token says without checking its signature or expiry: for routing only (the
// HTTP edge learns whose ticket it is, then the region verifies it). Never trust its answer.
func Peek(token string) (Ticket, error) {
	tok, err := ParseToken(token)
	if err != nil {
		return Ticket{}, err
	}
	return tok.Ticket, nil
}
