package transfer

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCheckID: an accepted id is printable ASCII from the allowed set, 1..MaxIDLen bytes,
// never holds the separators the system uses in keys ('|', '\x00'), and starts with a letter
// or digit; a refused one says why. The table CheckID uses agrees with the pattern it stands
// for on every input.
func FuzzCheckID(f *testing.F) {
	pattern := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$`)
	for _, s := range []string{"", "a", "sale-2026/phone", "a b", "|x", "é", strings.Repeat("z", 129), "-x", "user@example.com"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		why := CheckID(id)
		if want := id != "" && len(id) <= MaxIDLen && pattern.MatchString(id); (why == "") != want {
			t.Fatalf("CheckID(%q) = %q, the pattern says valid=%v", id, why, want)
		}
		if why != "" {
			return
		}
		if len(id) == 0 || len(id) > MaxIDLen || !utf8.ValidString(id) || strings.ContainsAny(id, "|\x00 \t\n") {
			t.Fatalf("accepted %q", id)
		}
		c := id[0]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			t.Fatalf("accepted %q starting with %q", id, c)
		}
	})
}

// FuzzSplit: any total and weights either are refused or split into non-negative parts that
// sum to the total.
func FuzzSplit(f *testing.F) {
	f.Add(int64(10000), int64(40), int64(35), int64(25))
	f.Add(int64(0), int64(0), int64(0), int64(1))
	f.Fuzz(func(t *testing.T, total, a, b, c int64) {
		if total < 0 || total > int64(MaxUnits) || a > 1_000_000 || b > 1_000_000 || c > 1_000_000 {
			return
		}
		parts, err := Split(Units(total), []Weight{{"a", a}, {"b", b}, {"c", c}})
		if err != nil {
			return
		}
		var sum Units
		for _, p := range parts {
			if p < 0 {
				t.Fatalf("negative part in %v", parts)
			}
			sum += p
		}
		if sum != Units(total) {
			t.Fatalf("parts %v sum to %d, not %d", parts, sum, total)
		}
	})
}
