package coordhttp

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
)

// A login token is "qc1.<key-id>.<role>.<name>.<expires>.<mac>": the console key that signed
// it, the role it logs in as (operator or auditor), a name for the logs (1 to 32 characters of
// A-Z a-z 0-9 _ -), its expiry in Unix seconds (decimal, no leading zero) and the key's
// HMAC-SHA256 of everything before the last dot (unpadded base64url, admission.Keyring.MAC,
// domain tokenDomain). quotactl console token makes them; the console's login checks them.
const (
	tokenPrefix = "qc1"
	tokenDomain = "quota console login token"
	// MaxTokenLen bounds a token; longer ones are refused before they are parsed.
	MaxTokenLen = 256
	// MaxTokenTTL is the longest a token may live: a leaked token is good for at most this.
	MaxTokenTTL = 7 * 24 * time.Hour
	maxNameLen  = 32
	macLen      = 32
	// maxExpires is 9999-12-31T23:59:59Z.
	maxExpires = 253402300799
)

var macEncoding = base64.RawURLEncoding.Strict()

// Token is what a verified login token says.
type Token struct {
	KeyID   string
	Role    trust.Role
	Name    string
	Expires time.Time
}

// LoginRoles are the roles a console login may take: operators act, auditors only look.
var LoginRoles = []trust.Role{trust.Operator, trust.Auditor}

// SignToken makes a login token for role and name, valid until expires, signed with keys'
// signing key. The error is an *apierr.InvalidError naming a bad field.
func SignToken(keys *admission.Keyring, role trust.Role, name string, expires time.Time) (string, error) {
	if !loginRole(role) {
		return "", apierr.Invalid("role", "%q: a console login is operator or auditor", role)
	}
	if !validWord(name, maxNameLen) {
		return "", apierr.Invalid("name", "want 1 to %d characters of A-Z a-z 0-9 _ -", maxNameLen)
	}
	exp := expires.Unix()
	if exp <= 0 || exp > maxExpires {
		return "", apierr.Invalid("expires", "%s is out of range", expires)
	}
	body := func(kid string) string {
		return strings.Join([]string{tokenPrefix, kid, string(role), name, strconv.FormatInt(exp, 10)}, ".")
	}
	kid := keys.SigningKeyID()
	if kid == "" {
		return "", fmt.Errorf("sign token: the console key file has no key")
	}
	gotKid, mac, err := keys.MAC(tokenDomain, []byte(body(kid)))
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return body(gotKid) + "." + macEncoding.EncodeToString(mac), nil
}

// ParseToken reads a token's fields without checking its MAC: the signed text and the MAC
// are returned for VerifyToken. Every error wraps apierr.ErrUnauthenticated and says what is
// malformed; none quotes the token.
func ParseToken(s string) (Token, string, []byte, error) {
	if len(s) > MaxTokenLen {
		return Token{}, "", nil, badToken("over %d bytes", MaxTokenLen)
	}
	parts := strings.Split(s, ".")
	if len(parts) != 6 || parts[0] != tokenPrefix {
		return Token{}, "", nil, badToken("not a console login token (want qc1. and 6 fields)")
	}
	t := Token{KeyID: parts[1], Role: trust.Role(parts[2]), Name: parts[3]}
	switch {
	case !validWord(t.KeyID, 32):
		return Token{}, "", nil, badToken("bad key id")
	case !loginRole(t.Role):
		return Token{}, "", nil, badToken("role must be operator or auditor")
	case !validWord(t.Name, maxNameLen):
		return Token{}, "", nil, badToken("bad name")
	}
	exp, err := parseExpiry(parts[4])
	if err != nil {
		return Token{}, "", nil, err
	}
	t.Expires = time.Unix(exp, 0)
	mac, err := macEncoding.DecodeString(parts[5])
	if err != nil || len(mac) != macLen || strings.ContainsAny(parts[5], "\r\n") {
		return Token{}, "", nil, badToken("bad signature encoding")
	}
	return t, s[:len(s)-len(parts[5])-1], mac, nil
}

// parseExpiry reads the expiry field: 1 to 12 digits, no leading zero, at most maxExpires.
func parseExpiry(f string) (int64, error) {
	if f == "" || len(f) > 12 || f[0] == '0' {
		return 0, badToken("bad expiry")
	}
	for i := 0; i < len(f); i++ {
		if f[i] < '0' || f[i] > '9' {
			return 0, badToken("bad expiry")
		}
	}
	exp, err := strconv.ParseInt(f, 10, 64)
	if err != nil || exp > maxExpires {
		return 0, badToken("bad expiry")
	}
	return exp, nil
}

// VerifyToken checks a token: well formed, signed by a key of keys, not expired at now, and
// living at most MaxTokenTTL from now. Errors wrap apierr.ErrUnauthenticated.
func VerifyToken(keys *admission.Keyring, s string, now time.Time) (Token, error) {
	t, signed, mac, err := ParseToken(s)
	if err != nil {
		return Token{}, err
	}
	if !keys.CheckMAC(t.KeyID, tokenDomain, []byte(signed), mac) {
		return Token{}, badToken("bad signature or unknown key %s", t.KeyID)
	}
	if !now.Before(t.Expires) {
		return Token{}, badToken("expired at %s", t.Expires.UTC().Format(time.RFC3339))
	}
	if t.Expires.Sub(now) > MaxTokenTTL+time.Minute {
		return Token{}, badToken("expires more than %s from now", MaxTokenTTL)
	}
	return t, nil
}

func badToken(format string, args ...any) error {
	return fmt.Errorf("console login token: %s: %w", fmt.Sprintf(format, args...), apierr.ErrUnauthenticated)
}

func loginRole(r trust.Role) bool {
	for _, l := range LoginRoles {
		if r == l {
			return true
		}
	}
	return false
}

// validWord reports whether s is 1..max characters of [A-Za-z0-9_-].
func validWord(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
