package admission

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// testRand is a deterministic random source for key files.
func testRand(seed byte) *rand.ChaCha8 {
	var s [32]byte
	s[0] = seed
	return rand.NewChaCha8(s)
}

// secretText is a standard-base64 32-byte secret made of b.
func secretText(b byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, secretSize))
}

func TestParseKeyringErrors(t *testing.T) {
	s1, s2, s3 := secretText(1), secretText(2), secretText(3)
	short := base64.StdEncoding.EncodeToString(make([]byte, 16))
	tests := []struct {
		name, file string
		want       []string // substrings of the error
	}{
		{"empty", "", []string{"no key"}},
		{"only comments", "# a\n\n   \n#k1 " + s1 + "\n", []string{"no key"}},
		{"bad base64", "k1 " + s1[:20] + "!" + s1[21:] + "\n", []string{"line 1", "not standard base64"}},
		{"unpadded base64", "k1 " + strings.TrimRight(s1, "=") + "\n", []string{"line 1", "not standard base64"}},
		{"base64 with + and /", "k1 " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 32)) + "\n", nil},
		{"wrong length", "# c\nk1 " + short + "\n", []string{"line 2", "16 bytes, want 32"}},
		{"duplicate id", "k1 " + s1 + "\n\nk1 " + s2 + "\n", []string{"line 3", "duplicate key id k1", "line 1"}},
		{"three keys", "k1 " + s1 + "\nk2 " + s2 + "\nk3 " + s3 + "\n", []string{"line 3", "more than 2 keys"}},
		{"one word", "k1\n", []string{"line 1", "got 1 words"}},
		{"secret only", s1 + "\n", []string{"line 1", "got 1 words"}},
		{"three words", "k1 " + s1 + " extra\n", []string{"line 1", "got 3 words"}},
		{"swapped", s1 + " k1\n", []string{"line 1", "bad key id"}},
		{"id too long", strings.Repeat("k", 33) + " " + s1 + "\n", []string{"line 1", "bad key id"}},
		{"id bad char", "k.1 " + s1 + "\n", []string{"line 1", "bad key id"}},
		{"id not ascii", "kö " + s1 + "\n", []string{"line 1", "bad key id"}},
		{"not utf-8", "k1 " + s1 + "\n# \xff\n", []string{"line 2", "not UTF-8"}},
		{"too big", strings.Repeat("#", maxKeyFileSize+1), []string{"over the 65536-byte limit"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := ParseKeyring([]byte(tt.file))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("ParseKeyring: %v, want a keyring", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseKeyring = %v, want an error with %q", k, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			for _, s := range []string{s1, s2, s3, short, s1[:20]} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q shows a secret", err)
				}
			}
		})
	}
}

func TestParseKeyringAccepts(t *testing.T) {
	s1, s2 := secretText(1), secretText(2)
	file := "\ufeff# ticket keys\r\n\r\n  new_Key-2 \t" + s1 + "  \r\n# old\r\nold " + s2
	k, err := ParseKeyring([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if got := k.SigningKeyID(); got != "new_Key-2" {
		t.Errorf("SigningKeyID = %q, want new_Key-2", got)
	}
	if got := k.IDs(); !slices.Equal(got, []string{"new_Key-2", "old"}) {
		t.Errorf("IDs = %q", got)
	}
	if key, _ := k.lookup("old"); key.secret != [32]byte(bytes.Repeat([]byte{2}, 32)) {
		t.Errorf("secret of old not read")
	}
	k.IDs()[0] = "changed"
	if k.SigningKeyID() != "new_Key-2" {
		t.Error("IDs shares the keyring's state")
	}
}

func TestKeyringNeverPrintsSecret(t *testing.T) {
	file, err := NewKeyFile(testRand(1))
	if err != nil {
		t.Fatal(err)
	}
	file, err = RotateKeyFile(file, testRand(2))
	if err != nil {
		t.Fatal(err)
	}
	k, err := ParseKeyring(file)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("keyring(sign %s, verify %s %s)", k.IDs()[0], k.IDs()[0], k.IDs()[1])
	if k.String() != want {
		t.Errorf("String = %q, want %q", k.String(), want)
	}
	var secrets []string
	for _, key := range k.keys {
		secrets = append(secrets, base64.StdEncoding.EncodeToString(key.secret[:]),
			fmt.Sprintf("%x", key.secret[:6]), fmt.Sprintf("%X", key.secret[:6]), fmt.Sprint(key.secret[:3]))
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%d", "%q", "%08b"} {
		for _, arg := range []any{k, *k, []*Keyring{k}, struct{ K Keyring }{*k}} {
			out := fmt.Sprintf(verb, arg)
			for _, s := range secrets {
				if strings.Contains(out, s) {
					t.Errorf("Sprintf(%q) = %q shows a secret", verb, out)
				}
			}
			if !strings.Contains(out, "keyring(sign ") {
				t.Errorf("Sprintf(%q) = %q, not the keyring's String", verb, out)
			}
		}
	}
	var nilRing *Keyring
	if got := fmt.Sprint(nilRing); got != "<nil>" {
		t.Errorf("Sprint(nil keyring) = %q", got)
	}
}

var keyIDPattern = regexp.MustCompile(`^k[0-9a-f]{8}$`)

func TestNewKeyFile(t *testing.T) {
	file, err := NewKeyFile(testRand(1))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(file, []byte("# Admission ticket keys")) {
		t.Errorf("no comment header:\n%s", file)
	}
	k, err := ParseKeyring(file)
	if err != nil {
		t.Fatalf("ParseKeyring(NewKeyFile): %v\n%s", err, file)
	}
	if ids := k.IDs(); len(ids) != 1 || !keyIDPattern.MatchString(ids[0]) {
		t.Errorf("IDs = %q, want one id like k0123abcd", ids)
	}
	again, _ := NewKeyFile(testRand(1))
	other, _ := NewKeyFile(testRand(2))
	if !bytes.Equal(file, again) || bytes.Equal(file, other) {
		t.Error("NewKeyFile is not a function of its random bytes")
	}
}

func TestNewKeyFileRandomFailures(t *testing.T) {
	if _, err := NewKeyFile(bytes.NewReader(make([]byte, 10))); err == nil || !strings.Contains(err.Error(), "random") {
		t.Errorf("short random source: err = %v", err)
	}
	if _, err := NewKeyFile(bytes.NewReader(make([]byte, 100))); err == nil || !strings.Contains(err.Error(), "zeros") {
		t.Errorf("zero random source: err = %v", err)
	}
	if _, err := NewKeyFile(nil); err == nil {
		t.Error("nil random source: no error")
	}
}

func TestRotateKeyFile(t *testing.T) {
	first, err := NewKeyFile(testRand(1))
	if err != nil {
		t.Fatal(err)
	}
	once, err := RotateKeyFile(first, testRand(2))
	if err != nil {
		t.Fatal(err)
	}
	twice, err := RotateKeyFile(once, testRand(3))
	if err != nil {
		t.Fatal(err)
	}
	k1, k2, k3 := mustKeyring(t, first), mustKeyring(t, once), mustKeyring(t, twice)
	if got, want := k2.IDs(), []string{k2.SigningKeyID(), k1.SigningKeyID()}; !slices.Equal(got, want) ||
		got[0] == got[1] {
		t.Errorf("rotated once: IDs = %q, want a fresh key then %q", got, k1.SigningKeyID())
	}
	if got, want := k3.IDs(), []string{k3.SigningKeyID(), k2.SigningKeyID()}; !slices.Equal(got, want) ||
		slices.Contains(got, k1.SigningKeyID()) {
		t.Errorf("rotated twice: IDs = %q, want a fresh key then %q", got, k2.SigningKeyID())
	}
	if old, _ := k3.lookup(k2.SigningKeyID()); old != k2.keys[0] {
		t.Error("rotation changed the old signing key's secret")
	}
	if !bytes.HasPrefix(twice, []byte("# Admission ticket keys")) {
		t.Error("rotated file has no comment header")
	}
}

func TestRotateKeyFileAvoidsTheOldID(t *testing.T) {
	// A source that repeats the same 36 bytes gives the old id again; rotation must not reuse it.
	block := make([]byte, newKeyIDBytes+secretSize)
	for i := range block {
		block[i] = byte(i + 1)
	}
	old, err := NewKeyFile(bytes.NewReader(block))
	if err != nil {
		t.Fatal(err)
	}
	_, err = RotateKeyFile(old, bytes.NewReader(bytes.Repeat(block, 4)))
	if err == nil || !strings.Contains(err.Error(), "4 times") {
		t.Errorf("RotateKeyFile with a stuck source: err = %v", err)
	}
	next := append(bytes.Repeat(block, 2), testRandBytes(36)...)
	rotated, err := RotateKeyFile(old, bytes.NewReader(next))
	if err != nil {
		t.Fatal(err)
	}
	if ids := mustKeyring(t, rotated).IDs(); ids[0] == ids[1] {
		t.Errorf("rotated IDs = %q", ids)
	}
}

func TestRotateKeyFileBadOld(t *testing.T) {
	_, err := RotateKeyFile([]byte("k1 nope\n"), testRand(1))
	if err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("RotateKeyFile(bad) err = %v", err)
	}
}

func testRandBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = testRand(9).Read(b)
	return b
}

func mustKeyring(t testing.TB, file []byte) *Keyring {
	t.Helper()
	k, err := ParseKeyring(file)
	if err != nil {
		t.Fatalf("ParseKeyring: %v\n%s", err, file)
	}
	return k
}

func FuzzParseKeyring(f *testing.F) {
	s1, s2 := secretText(1), secretText(2)
	for _, seed := range []string{
		"", "k1 " + s1, "k1 " + s1 + "\nk2 " + s2 + "\n", "# c\n\nk1 " + s1 + "\r\n", "k1 " + s1 + "\nk1 " + s2,
		"k1 " + s1 + "\nk2 " + s2 + "\nk3 " + s1, s1, "k1 " + s1[:10], "\ufeffk-_9 " + s2, "k1 \xff",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseKeyring(data)
		if err != nil {
			if k != nil {
				t.Fatal("a keyring with an error")
			}
			for _, word := range strings.Fields(string(data)) {
				_, b64err := base64.StdEncoding.DecodeString(word)
				if b64err == nil && len(word) >= 12 && !validKeyID(word) && strings.Contains(err.Error(), word) {
					t.Fatalf("error %q quotes the input word %q", err, word)
				}
			}
			return
		}
		ids := k.IDs()
		if len(ids) < 1 || len(ids) > maxRingKeys || k.SigningKeyID() != ids[0] {
			t.Fatalf("IDs = %q", ids)
		}
		for _, id := range ids {
			if !validKeyID(id) {
				t.Fatalf("bad id %q accepted", id)
			}
		}
		again, err := ParseKeyring(formatKeyFile(k.keys))
		if err != nil || !slices.Equal(again.keys, k.keys) {
			t.Fatalf("formatted keyring does not parse back: %v", err)
		}
		rotated, err := RotateKeyFile(data, testRand(1))
		if err != nil {
			t.Fatalf("RotateKeyFile of a good file: %v", err)
		}
		if r := mustKeyring(t, rotated); r.keys[1] != k.keys[0] {
			t.Fatal("rotation lost the signing key")
		}
	})
}
