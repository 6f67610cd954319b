package admission

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

var ticketNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// sampleTicket is a ticket valid for ten minutes from ticketNow.
func sampleTicket() Ticket {
	return Ticket{
		Sale: "spring-drop", User: "user-42", Region: "eu-west", Admission: "adm-7",
		Expires: ticketNow.Add(10 * time.Minute),
	}
}

// testRings is a key file, the same rotated once, and rotated twice.
func testRings(t testing.TB) (first, once, twice *Keyring) {
	t.Helper()
	f0, err := NewKeyFile(testRand(1))
	if err != nil {
		t.Fatal(err)
	}
	f1, err := RotateKeyFile(f0, testRand(2))
	if err != nil {
		t.Fatal(err)
	}
	f2, err := RotateKeyFile(f1, testRand(3))
	if err != nil {
		t.Fatal(err)
	}
	return mustKeyring(t, f0), mustKeyring(t, f1), mustKeyring(t, f2)
}

func mustSign(t testing.TB, k *Keyring, tk Ticket) string {
	t.Helper()
	token, err := k.Sign(tk)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return token
}

// wantInvalid fails t unless err wraps ErrTicketInvalid, says reason and shows no secret of k.
func wantInvalid(t testing.TB, k *Keyring, err error, reason string) {
	t.Helper()
	if !errors.Is(err, ErrTicketInvalid) {
		t.Fatalf("err = %v, want ErrTicketInvalid", err)
	}
	if !strings.Contains(err.Error(), reason) {
		t.Errorf("err = %q, want it to say %q", err, reason)
	}
	for _, key := range k.keys {
		if strings.Contains(err.Error(), base64.StdEncoding.EncodeToString(key.secret[:])) ||
			strings.Contains(err.Error(), string(key.secret[:8])) {
			t.Errorf("err = %q shows a secret", err)
		}
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	k, _, _ := testRings(t)
	withSKU := sampleTicket()
	withSKU.SKU = "tee-xl"
	subMilli := sampleTicket()
	subMilli.Expires = subMilli.Expires.Add(123456789 * time.Nanosecond).In(time.FixedZone("x", 3600))
	maxed := Ticket{
		Sale: strings.Repeat("s", 128), User: strings.Repeat("u", 128), Region: strings.Repeat("r", 128),
		Admission: strings.Repeat("a", 128), SKU: strings.Repeat("k", 128), Expires: ticketNow.Add(time.Second),
	}
	for _, tk := range []Ticket{sampleTicket(), withSKU, subMilli, maxed} {
		tk.KeyID = "ignored"
		token := mustSign(t, k, tk)
		if !strings.HasPrefix(token, "v1.") || len(token) > MaxTokenLen {
			t.Errorf("token %q: want a v1. token of at most %d bytes", token, MaxTokenLen)
		}
		got, err := k.Verify(token, ticketNow)
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		want := tk
		want.KeyID = k.SigningKeyID()
		want.Expires = time.UnixMilli(tk.Expires.UnixMilli()).UTC()
		if got != want {
			t.Errorf("Verify = %+v, want %+v", got, want)
		}
		if err := got.Check(tk.Sale, tk.User, tk.Region); err != nil {
			t.Errorf("Check of its own fields: %v", err)
		}
	}
}

func TestSignRejectsBadTickets(t *testing.T) {
	k, _, _ := testRings(t)
	long := strings.Repeat("x", MaxTicketFieldLen+1)
	tests := []struct {
		name  string
		edit  func(*Ticket)
		field string
	}{
		{"no sale", func(t *Ticket) { t.Sale = "" }, "ticket sale"},
		{"no user", func(t *Ticket) { t.User = "" }, "ticket user"},
		{"no region", func(t *Ticket) { t.Region = "" }, "ticket region"},
		{"no admission", func(t *Ticket) { t.Admission = "" }, "ticket admission"},
		{"long sale", func(t *Ticket) { t.Sale = long }, "ticket sale"},
		{"long user", func(t *Ticket) { t.User = long }, "ticket user"},
		{"long region", func(t *Ticket) { t.Region = long }, "ticket region"},
		{"long admission", func(t *Ticket) { t.Admission = long }, "ticket admission"},
		{"long sku", func(t *Ticket) { t.SKU = long }, "ticket sku"},
		{"no expiry", func(t *Ticket) { t.Expires = time.Time{} }, "ticket expires"},
		{"expiry before 1970", func(t *Ticket) { t.Expires = time.Unix(-1, 0) }, "ticket expires"},
		{"expiry after 9999", func(t *Ticket) { t.Expires = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "ticket expires"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := sampleTicket()
			tt.edit(&tk)
			token, err := k.Sign(tk)
			var inv *apierr.InvalidError
			if !errors.As(err, &inv) || inv.Field != tt.field || !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("Sign = %q, %v; want an invalid-argument error on %q", token, err, tt.field)
			}
		})
	}
	if _, err := (&Keyring{}).Sign(sampleTicket()); err == nil {
		t.Error("an empty keyring signed")
	}
}

func TestVerifyTamperEveryByte(t *testing.T) {
	k, _, _ := testRings(t)
	tk := sampleTicket()
	tk.SKU = "tee"
	token := mustSign(t, k, tk)
	const alphabet = "ABZaz09-_.\n=+/ \x00\xff"
	for i := range len(token) {
		for _, c := range []byte(alphabet) {
			if token[i] == c {
				continue
			}
			tampered := token[:i] + string(c) + token[i+1:]
			if _, err := k.Verify(tampered, ticketNow); !errors.Is(err, ErrTicketInvalid) {
				t.Fatalf("byte %d set to %q: Verify err = %v, want ErrTicketInvalid", i, c, err)
			}
		}
		if _, err := k.Verify(token[:i]+token[i+1:], ticketNow); !errors.Is(err, ErrTicketInvalid) {
			t.Fatalf("byte %d dropped: Verify err = %v", i, err)
		}
	}
	if _, err := k.Verify(token+"A", ticketNow); !errors.Is(err, ErrTicketInvalid) {
		t.Fatalf("byte appended: Verify err = %v", err)
	}
}

func TestVerifyBadSignature(t *testing.T) {
	k, _, _ := testRings(t)
	token := mustSign(t, k, sampleTicket())
	dot := strings.LastIndexByte(token, '.')
	sig := []byte(token[dot+1:])
	sig[0] ^= 'A' ^ 'B' // another base64url character: the MAC's first bits change
	_, err := k.Verify(token[:dot+1]+string(sig), ticketNow)
	wantInvalid(t, k, err, "bad signature")

	// The same key id with another secret: a forged key file.
	forged := &Keyring{keys: []ringKey{{id: k.SigningKeyID()}}}
	forged.keys[0].secret[0] = 1
	_, err = k.Verify(mustSign(t, forged, sampleTicket()), ticketNow)
	wantInvalid(t, k, err, "bad signature")
}

func TestVerifyExpired(t *testing.T) {
	k, _, _ := testRings(t)
	tk := sampleTicket()
	token := mustSign(t, k, tk)
	if _, err := k.Verify(token, tk.Expires.Add(-time.Millisecond)); err != nil {
		t.Errorf("a millisecond before expiry: %v", err)
	}
	_, err := k.Verify(token, tk.Expires)
	wantInvalid(t, k, err, "expired at 2026-03-01T12:10:00.000Z")
	_, err = k.Verify(token, tk.Expires.Add(time.Hour))
	wantInvalid(t, k, err, "expired at")
}

// TestVerifySignatureIgnoresOnlyExpiry: VerifySignature answers an expired ticket's buyer
// (CheckLive says it expired) and refuses what Verify refuses for its signature: a changed
// MAC, another secret under the same key id, an unknown key.
func TestVerifySignatureIgnoresOnlyExpiry(t *testing.T) {
	k, _, _ := testRings(t)
	tk := sampleTicket()
	token := mustSign(t, k, tk)
	tok, err := ParseToken(token)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.VerifySignature(tok)
	if err != nil || got.User != tk.User {
		t.Fatalf("VerifySignature of a good ticket: %+v, %v", got, err)
	}
	if err := got.CheckLive(tk.Expires.Add(-time.Millisecond)); err != nil {
		t.Errorf("CheckLive a millisecond before expiry: %v", err)
	}
	wantInvalid(t, k, got.CheckLive(tk.Expires), "expired at 2026-03-01T12:10:00.000Z")
	forged := &Keyring{keys: []ringKey{{id: k.SigningKeyID()}}}
	forged.keys[0].secret[0] = 1
	unknown := &Keyring{keys: []ringKey{{id: "other"}}}
	dot := strings.LastIndexByte(token, '.')
	sig := []byte(token[dot+1:])
	sig[0] ^= 'A' ^ 'B'
	for reason, text := range map[string]string{
		"bad signature":     mustSign(t, forged, tk),
		"unknown key other": mustSign(t, unknown, tk),
	} {
		tok, err := ParseToken(text)
		if err != nil {
			t.Fatal(err)
		}
		_, err = k.VerifySignature(tok)
		wantInvalid(t, k, err, reason)
	}
	tampered, err := ParseToken(token[:dot+1] + string(sig))
	if err != nil {
		t.Fatal(err)
	}
	_, err = k.VerifySignature(tampered)
	wantInvalid(t, k, err, "bad signature")
}

func TestVerifyMalformed(t *testing.T) {
	k, _, _ := testRings(t)
	good := mustSign(t, k, sampleTicket())
	parts := strings.Split(good, ".")
	enc := base64.RawURLEncoding.EncodeToString
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	tests := []struct{ name, token, reason string }{
		{"empty", "", "malformed: empty token"},
		{"too long", good + strings.Repeat("A", MaxTokenLen), "over 2048"},
		{"other version", "v2." + parts[1] + "." + parts[2], "not a v1 token"},
		{"no signature", "v1." + parts[1], "3 parts"},
		{"four parts", good + ".AAAA", "3 parts"},
		{"padded", good + "=", "byte"},
		{"newline", good[:10] + "\n" + good[10:], "byte 10"},
		{"standard base64", "v1." + parts[1] + "+." + parts[2], "byte"},
		{"payload not base64", "v1.A." + parts[2], "payload is not base64url"},
		{"signature not base64", "v1." + parts[1] + ".A", "signature is not base64url"},
		{"short signature", "v1." + parts[1] + "." + parts[2][:20], "signature is 15 bytes"},
		{"empty payload", "v1.." + parts[2], "unknown payload version"},
		{"payload version 2", "v1." + enc(append([]byte{2}, payload[1:]...)) + "." + parts[2], "unknown payload version"},
		{"truncated payload", "v1." + enc(payload[:len(payload)-1]) + "." + parts[2], "ends inside field 7"},
		{"trailing bytes", "v1." + enc(append(payload, 0)) + "." + parts[2], "1 bytes after the last field"},
		{"empty sale", "v1." + enc(encodeRaw("", "u", "r", "a", "", 1e12, "k1")) + "." + parts[2], "sale is empty"},
		{"bad key id", "v1." + enc(encodeRaw("s", "u", "r", "a", "", 1e12, "k 1")) + "." + parts[2], "key id is not"},
		{"expiry 0", "v1." + enc(encodeRaw("s", "u", "r", "a", "", 0, "k1")) + "." + parts[2], "expiry is not between"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := k.Verify(tt.token, ticketNow)
			wantInvalid(t, k, err, tt.reason)
		})
	}
}

// encodeRaw builds a payload from fields without checking them.
func encodeRaw(sale, user, region, admission, sku string, ms int64, keyID string) []byte {
	return encodePayload(Ticket{
		Sale: sale, User: user, Region: region, Admission: admission, SKU: sku,
		Expires: time.UnixMilli(ms), KeyID: keyID,
	})
}

func TestVerifyUnknownKey(t *testing.T) {
	first, _, _ := testRings(t)
	other := mustKeyring(t, must(NewKeyFile(testRand(7))))
	_, err := first.Verify(mustSign(t, other, sampleTicket()), ticketNow)
	wantInvalid(t, first, err, "unknown key "+other.SigningKeyID())
	var none *Keyring
	_, err = none.Verify(mustSign(t, other, sampleTicket()), ticketNow)
	wantInvalid(t, other, err, "unknown key")
}

func TestRotationKeepsTheOldKeyOneRound(t *testing.T) {
	first, once, twice := testRings(t)
	byFirst := mustSign(t, first, sampleTicket())
	byOnce := mustSign(t, once, sampleTicket())

	// After one rotation the old signing key, now second, still verifies.
	got, err := once.Verify(byFirst, ticketNow)
	if err != nil {
		t.Fatalf("a ticket signed before the rotation: %v", err)
	}
	if got.KeyID != first.SigningKeyID() || got.KeyID == once.SigningKeyID() {
		t.Errorf("KeyID = %q, want the old key %q", got.KeyID, first.SigningKeyID())
	}
	if _, err := first.Verify(byOnce, ticketNow); err == nil {
		t.Error("the old file accepts a ticket signed with the new key")
	}

	// After a second rotation the first key is gone; the middle one still verifies.
	_, err = twice.Verify(byFirst, ticketNow)
	wantInvalid(t, twice, err, "unknown key "+first.SigningKeyID())
	if _, err := twice.Verify(byOnce, ticketNow); err != nil {
		t.Errorf("a ticket signed by the previous key after two rotations: %v", err)
	}
}

func TestTicketCheck(t *testing.T) {
	tk := sampleTicket()
	if err := tk.Check("spring-drop", "user-42", "eu-west"); err != nil {
		t.Fatalf("Check of a matching ticket: %v", err)
	}
	tests := []struct{ sale, user, region, reason string }{
		{"autumn", "user-42", "eu-west", `ticket is for sale "spring-drop", not "autumn"`},
		{"spring-drop", "user-43", "eu-west", `ticket is for user "user-42", not "user-43"`},
		{"spring-drop", "user-42", "us-east", `ticket is for region "eu-west", not "us-east"`},
		{"", "", "", `for sale "spring-drop", not ""`},
	}
	for _, tt := range tests {
		err := tk.Check(tt.sale, tt.user, tt.region)
		wantInvalid(t, &Keyring{}, err, tt.reason)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func FuzzVerifyTicket(f *testing.F) {
	first, once, _ := testRings(f)
	// swapped signs with once's second key, to re-sign what that key signed.
	swapped := &Keyring{keys: []ringKey{once.keys[1], once.keys[0]}}
	withSKU := sampleTicket()
	withSKU.SKU = "tee"
	good := mustSign(f, once, sampleTicket())
	for _, seed := range []string{
		good, mustSign(f, first, withSKU), mustSign(f, once, Ticket{Sale: "s", User: "u", Region: "r",
			Admission: "a", Expires: ticketNow.Add(-time.Second)}),
		good[:len(good)-1], good + "A", strings.Replace(good, "v1.", "v2.", 1), "", "v1..", "v1.AQ.AA",
		"v1." + base64.RawURLEncoding.EncodeToString(encodeRaw("s", "u", "r", "a", "", 1e13, "k1")) + "." +
			strings.Repeat("A", 43),
		strings.Repeat(".", 3000),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		tk, err := once.Verify(token, ticketNow)
		sameAsParsed(t, once, token, tk, err)
		if err != nil {
			wantInvalid(t, once, err, "")
			if tk != (Ticket{}) {
				t.Fatalf("Verify failed but returned %+v", tk)
			}
			return
		}
		signer := once
		if tk.KeyID != once.SigningKeyID() {
			signer = swapped
		}
		again, err := signer.Sign(tk)
		if err != nil {
			t.Fatalf("an accepted ticket does not sign: %v", err)
		}
		if again != token {
			t.Fatalf("accepted %q, which re-signs as %q", token, again)
		}
		if err := tk.Check(tk.Sale, tk.User, tk.Region); err != nil {
			t.Fatal(err)
		}
	})
}

// sameAsParsed fails unless reading token once (ParseToken, then VerifyToken and Peek) answers
// what Verify answered: tk and err.
func sameAsParsed(t *testing.T, k *Keyring, token string, tk Ticket, err error) {
	t.Helper()
	tok, perr := ParseToken(token)
	peeked, peekErr := Peek(token)
	if perr != nil {
		if err == nil || err.Error() != perr.Error() || peekErr == nil || peekErr.Error() != perr.Error() || peeked != (Ticket{}) {
			t.Fatalf("%q: ParseToken %v, Peek %+v %v; Verify %v", token, perr, peeked, peekErr, err)
		}
		return
	}
	if tok.Text() != token || peekErr != nil || peeked != tok.Ticket {
		t.Fatalf("%q: ParseToken read %q (%+v), Peek %+v %v", token, tok.Text(), tok.Ticket, peeked, peekErr)
	}
	vt, verr := k.VerifyToken(tok, ticketNow)
	if vt != tk || (verr == nil) != (err == nil) || err != nil && err.Error() != verr.Error() {
		t.Fatalf("%q: VerifyToken %+v %v; Verify %+v %v", token, vt, verr, tk, err)
	}
}

// TestParsedTokensVerifyAsTokens checks reading a token once against Verify on good,
// tampered, expired, foreign and malformed tokens, with and without the keyring's pools.
func TestParsedTokensVerifyAsTokens(t *testing.T) {
	first, once, _ := testRings(t)
	good := mustSign(t, once, sampleTicket())
	expired := sampleTicket()
	expired.Expires = ticketNow.Add(-time.Second)
	unpooled := &Keyring{keys: once.keys}
	for _, token := range []string{good, mustSign(t, first, sampleTicket()), mustSign(t, once, expired),
		good[:len(good)-2] + "AA", good[:len(good)-1], good + "AAAA", "v1." + good[3:20], "", "v2.x", "v1.AQ.AA"} {
		for _, k := range []*Keyring{once, unpooled} {
			tk, err := k.Verify(token, ticketNow)
			sameAsParsed(t, k, token, tk, err)
		}
	}
	if _, err := unpooled.Verify(good, ticketNow); err != nil {
		t.Errorf("a keyring without pools refuses a good ticket: %v", err)
	}
	if again := mustSign(t, &Keyring{keys: once.keys}, sampleTicket()); again != good {
		t.Errorf("a keyring without pools signs %q, with them %q", again, good)
	}
}

// TestVerifyAllocs pins the cost of checking a ticket at the region: its token read once
// (a few copies: the token's bytes, its payload, its fields, the Token) and verified with a
// keyed MAC from the keyring's pool, with no allocation.
func TestVerifyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("-race drops sync.Pool items at random; allocations are pinned in the run without -race")
	}
	_, once, _ := testRings(t)
	good := mustSign(t, once, sampleTicket())
	tok, err := ParseToken(good)
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(200, func() {
		if _, err := once.VerifyToken(tok, ticketNow); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("VerifyToken allocates %v times; want 0", n)
	}
	if n := testing.AllocsPerRun(200, func() {
		if _, err := ParseToken(good); err != nil {
			t.Fatal(err)
		}
	}); n > 4 {
		t.Errorf("ParseToken allocates %v times; want at most 4", n)
	}
}
