package coordhttp_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
)

func newKeys(t testing.TB) (*admission.Keyring, []byte) {
	t.Helper()
	data, err := admission.NewKeyFile(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := admission.ParseKeyring(data)
	if err != nil {
		t.Fatal(err)
	}
	return k, data
}

func sign(t testing.TB, k *admission.Keyring, role trust.Role, exp time.Time) string {
	t.Helper()
	tok, err := coordhttp.SignToken(k, role, "alice", exp)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestTokenRoundTrip: a signed token verifies to what was signed, for each login role, and
// a token signed before a key rotation still verifies after it.
func TestTokenRoundTrip(t *testing.T) {
	k, data := newKeys(t)
	now := time.Now()
	for _, role := range coordhttp.LoginRoles {
		tok := sign(t, k, role, now.Add(time.Hour))
		got, err := coordhttp.VerifyToken(k, tok, now)
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		if got.Role != role || got.Name != "alice" || got.KeyID != k.SigningKeyID() || got.Expires.Unix() != now.Add(time.Hour).Unix() {
			t.Fatalf("%s: verified %+v", role, got)
		}
		if len(tok) > coordhttp.MaxTokenLen {
			t.Fatalf("token of %d bytes, over MaxTokenLen", len(tok))
		}
	}
	old := sign(t, k, trust.Operator, now.Add(time.Hour))
	rotated, err := admission.RotateKeyFile(data, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := admission.ParseKeyring(rotated)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coordhttp.VerifyToken(k2, old, now); err != nil {
		t.Fatalf("a token of the previous key after a rotation: %v", err)
	}
	if _, err := coordhttp.VerifyToken(k2, sign(t, k2, trust.Auditor, now.Add(time.Hour)), now); err != nil {
		t.Fatal(err)
	}
}

// TestTokenRefusals: every forged, altered, expired or malformed token is refused
// UNAUTHENTICATED, and signing refuses roles and names a login cannot have.
func TestTokenRefusals(t *testing.T) {
	k, _ := newKeys(t)
	other, _ := newKeys(t)
	now := time.Now()
	good := sign(t, k, trust.Auditor, now.Add(time.Hour))
	parts := strings.Split(good, ".")
	swap := func(i int, v string) string {
		p := append([]string(nil), parts...)
		p[i] = v
		return strings.Join(p, ".")
	}
	cases := []struct{ name, token, want string }{
		{"empty", "", "not a console login token"},
		{"another key", sign(t, other, trust.Auditor, now.Add(time.Hour)), "bad signature"},
		{"auditor made operator", swap(2, "operator"), "bad signature"},
		{"expiry pushed", swap(4, "9999999999"), "bad signature"},
		{"name changed", swap(3, "mallory"), "bad signature"},
		{"storefront role", swap(2, "storefront"), "role must be"},
		{"expired", sign(t, k, trust.Operator, now.Add(-time.Second)), "expired"},
		{"lives too long", sign(t, k, trust.Operator, now.Add(coordhttp.MaxTokenTTL+time.Hour)), "more than"},
		{"leading zero expiry", swap(4, "0"+parts[4]), "bad expiry"},
		{"mac truncated", swap(5, parts[5][:20]), "signature encoding"},
		{"mac padded", swap(5, parts[5]+"="), "signature encoding"},
		{"ticket prefix", "v1." + parts[1], "not a console login token"},
		{"seven fields", good + ".x", "not a console login token"},
		{"too long", good + strings.Repeat("A", coordhttp.MaxTokenLen), "over"},
		{"bad key id", swap(1, "k!"), "bad key id"},
	}
	for _, c := range cases {
		_, err := coordhttp.VerifyToken(k, c.token, now)
		if !errors.Is(err, apierr.ErrUnauthenticated) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want UNAUTHENTICATED saying %q", c.name, err, c.want)
		}
		if err != nil && len(c.token) > 20 && strings.Contains(err.Error(), c.token) {
			t.Errorf("%s: the error quotes the token", c.name)
		}
	}
	for _, bad := range []struct {
		role trust.Role
		name string
	}{{trust.Storefront, "x"}, {trust.Coordinator, "x"}, {"", "x"}, {trust.Operator, ""}, {trust.Operator, "a.b"}, {trust.Operator, strings.Repeat("a", 33)}} {
		if _, err := coordhttp.SignToken(k, bad.role, bad.name, now.Add(time.Hour)); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("sign role %q name %q: %v; want INVALID_ARGUMENT", bad.role, bad.name, err)
		}
	}
}

// FuzzParseToken: the parser never panics, refuses with UNAUTHENTICATED, and what it
// accepts is canonical (its fields and MAC print back to the same text); no fuzzed text
// verifies under a key it was not signed with.
func FuzzParseToken(f *testing.F) {
	k, _ := newKeys(f)
	f.Add(sign(f, k, trust.Operator, time.Unix(2000000000, 0)))
	f.Add(sign(f, k, trust.Auditor, time.Unix(1, 0)))
	f.Add("qc1.k1.operator.a.1.AAAA")
	f.Add("qc1....." + strings.Repeat("A", 43))
	f.Add("v1.AAAA.AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		tok, signed, mac, err := coordhttp.ParseToken(s)
		if err != nil {
			if !errors.Is(err, apierr.ErrUnauthenticated) {
				t.Fatalf("%q: %v, not UNAUTHENTICATED", s, err)
			}
			return
		}
		if len(s) > coordhttp.MaxTokenLen || len(mac) != 32 {
			t.Fatalf("%q accepted with %d bytes, MAC %d bytes", s, len(s), len(mac))
		}
		if signed+"."+encode(mac) != s || !strings.HasPrefix(signed, "qc1."+tok.KeyID+"."+string(tok.Role)+"."+tok.Name+".") {
			t.Fatalf("%q: not canonical (signed %q)", s, signed)
		}
		if _, err := coordhttp.VerifyToken(k, s, time.Unix(0, 0)); err == nil && !bytes.Equal(mac, macOf(t, k, signed)) {
			t.Fatalf("%q verified without its MAC", s)
		}
	})
}
