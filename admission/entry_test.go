package admission

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// entryKeys is a keyring of two keys: k2 signs, k1 still verifies.
func entryKeys(t testing.TB) (signer, older *Keyring) {
	t.Helper()
	both, err := ParseKeyring([]byte("k2 " + secretText(2) + "\nk1 " + secretText(1) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	old, err := ParseKeyring([]byte("k1 " + secretText(1) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return both, old
}

// parseLink parses the query q for sale.
func parseLink(sale string, q url.Values) (EntryLink, error) {
	return ParseEntry(sale, q.Get(EntryUser), q.Get(EntryExp), q.Get(EntrySig))
}

func TestEntryLinkRoundTrip(t *testing.T) {
	keys, _ := entryKeys(t)
	now := time.Unix(1_800_000_000, 0)
	q, err := keys.SignEntry("drop", "alice", now.Add(10*time.Minute+700*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if q.Get(EntryExp) != "1800000600" || !strings.HasPrefix(q.Get(EntrySig), "k2.") {
		t.Fatalf("link %v: want exp in whole seconds and the signing key's id", q)
	}
	e, err := parseLink("drop", q)
	if err != nil {
		t.Fatal(err)
	}
	if e.Sale != "drop" || e.User != "alice" || !e.Expires.Equal(now.Add(10*time.Minute)) || e.KeyID != "k2" {
		t.Fatalf("parsed %+v", e)
	}
	if err := keys.VerifyEntry(e, now); err != nil {
		t.Fatalf("a good link: %v", err)
	}
}

// TestEntryLinkRefusals: every way a link is wrong is refused, with a reason that says which,
// and the form errors name the field.
func TestEntryLinkRefusals(t *testing.T) {
	keys, old := entryKeys(t)
	now := time.Unix(1_800_000_000, 0)
	good, err := keys.SignEntry("drop", "alice", now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	byOld, err := old.SignEntry("drop", "alice", now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	with := func(q url.Values, k, v string) url.Values {
		c := url.Values{}
		for n, vs := range q {
			c[n] = append([]string(nil), vs...)
		}
		c.Set(k, v)
		return c
	}
	far, err := keys.SignEntry("drop", "alice", now.Add(MaxEntryTTL+time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	mac := good.Get(EntrySig)[3:]
	flipped := []byte(mac)
	flipped[5] ^= 1
	tests := []struct {
		name  string
		sale  string
		q     url.Values
		at    time.Time
		field string // an InvalidError on this field; "" for a verification failure
		want  string // a word of the reason
	}{
		{"no user", "drop", with(good, EntryUser, ""), now, EntryUser, "missing"},
		{"no exp", "drop", with(good, EntryExp, ""), now, EntryExp, "Unix seconds"},
		{"no sig", "drop", with(good, EntrySig, ""), now, EntrySig, "key-id"},
		{"signed exp", "drop", with(good, EntryExp, "+1800000060"), now, EntryExp, "digits"},
		{"exp too long", "drop", with(good, EntryExp, "1234567890123"), now, EntryExp, "digits"},
		{"exp zero", "drop", with(good, EntryExp, "0"), now, EntryExp, "leading zero"},
		{"exp with a leading zero", "drop", with(good, EntryExp, "01800000060"), now, EntryExp, "leading zero"},
		{"exp past 9999", "drop", with(good, EntryExp, "999999999999"), now, EntryExp, "9999"},
		{"user with a space", "drop", with(good, EntryUser, "al ice"), now, EntryUser, "printable"},
		{"user too long", "drop", with(good, EntryUser, strings.Repeat("a", MaxTicketFieldLen+1)), now, EntryUser, "bytes"},
		{"sig without a key", "drop", with(good, EntrySig, mac), now, EntrySig, "key-id"},
		{"sig with a bad key id", "drop", with(good, EntrySig, "k!."+mac), now, EntrySig, "key-id"},
		{"sig padded", "drop", with(good, EntrySig, good.Get(EntrySig)+"="), now, EntrySig, "base64url"},
		{"sig short", "drop", with(good, EntrySig, good.Get(EntrySig)[:20]), now, EntrySig, "base64url"},
		{"sig too long", "drop", with(good, EntrySig, good.Get(EntrySig)+strings.Repeat("A", 40)), now, EntrySig, "over"},
		{"another user", "drop", with(good, EntryUser, "mallory"), now, "", "bad signature"},
		{"another sale", "other", good, now, "", "bad signature"},
		{"another expiry", "drop", with(good, EntryExp, "1800000061"), now, "", "bad signature"},
		{"a MAC bit flipped", "drop", with(good, EntrySig, "k2."+string(flipped)), now, "", "bad signature"},
		{"an unknown key", "drop", with(good, EntrySig, "k9."+mac), now, "", "unknown key k9"},
		{"expired", "drop", good, now.Add(time.Minute), "", "expired at"},
		{"too far ahead", "drop", far, now, "", "more than 24h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := parseLink(tt.sale, tt.q)
			if err == nil {
				err = keys.VerifyEntry(e, tt.at)
			}
			var inv *apierr.InvalidError
			switch {
			case err == nil:
				t.Fatal("accepted")
			case tt.field != "" && (!errors.As(err, &inv) || inv.Field != tt.field):
				t.Fatalf("%v: want an invalid %s", err, tt.field)
			case tt.field == "" && !errors.Is(err, apierr.ErrUnauthenticated):
				t.Fatalf("%v: want UNAUTHENTICATED", err)
			case !strings.Contains(err.Error(), tt.want):
				t.Fatalf("%v: want it to say %q", err, tt.want)
			case strings.Contains(err.Error(), secretText(2)) || strings.Contains(err.Error(), mac):
				t.Fatalf("%v shows a secret or the MAC", err)
			}
		})
	}
	// A link signed by the older key verifies while the file still holds it.
	e, err := parseLink("drop", byOld)
	if err != nil || keys.VerifyEntry(e, now) != nil {
		t.Fatalf("a link of the second key: %v, %v", err, keys.VerifyEntry(e, now))
	}
	// An entry link's MAC is no ticket's and no other domain's.
	if _, m, _ := keys.MAC("quota.console.token", entryMessage("drop", "alice", now.Add(time.Minute).Unix())); tokenEncoding.EncodeToString(m) == mac {
		t.Fatal("the entry link's MAC equals another domain's")
	}
}

// FuzzParseEntry: any fields either parse to an entry that formats back to the same fields
// (one text per entry) or are refused naming a field; no input panics, and none verifies
// unless the keyring signed it.
func FuzzParseEntry(f *testing.F) {
	keys, _ := entryKeys(f)
	now := time.Unix(1_800_000_000, 0)
	good, err := keys.SignEntry("drop", "alice", now.Add(time.Minute))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("drop", "alice", good.Get(EntryExp), good.Get(EntrySig))
	f.Add("drop", "alice", "1800000060", "k2.AAAA")
	f.Add("drop", "", "", "")
	f.Add("s", "u", "007", "k1."+strings.Repeat("A", 43))
	f.Add("s", "u\x00", "1", "k1.\n"+strings.Repeat("A", 42))
	f.Fuzz(func(t *testing.T, sale, user, exp, sig string) {
		e, err := ParseEntry(sale, user, exp, sig)
		if err != nil {
			var inv *apierr.InvalidError
			if !errors.As(err, &inv) || inv.Field == "" {
				t.Fatalf("ParseEntry(%q, %q, %q, %q): %v, want an invalid field", sale, user, exp, sig, err)
			}
			return
		}
		if e.Sale != sale || e.User != user || strconv.FormatInt(e.Expires.Unix(), 10) != exp || e.KeyID == "" {
			t.Fatalf("ParseEntry(%q, %q, %q, %q) = %+v", sale, user, exp, sig, e)
		}
		if back := e.KeyID + "." + tokenEncoding.EncodeToString(e.mac[:]); back != sig {
			t.Fatalf("sig %q parsed and formatted is %q", sig, back)
		}
		signed := sale == "drop" && user == "alice" && e.Expires.Unix() == now.Add(time.Minute).Unix() && sig == good.Get(EntrySig)
		if err := keys.VerifyEntry(e, now); (err == nil) != signed {
			t.Fatalf("VerifyEntry(%+v): %v; the keyring signed it: %v", e, err, signed)
		}
	})
}
