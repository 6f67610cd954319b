package transfer

import (
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestNextTable(t *testing.T) {
	states := []State{Requested, Pending, Posted, Voided}
	events := []Event{Debited, Credited, Refused, Aborted}
	allowed := map[[2]string]State{
		{"requested", "debited"}: Pending,
		{"requested", "aborted"}: Voided,
		{"pending", "credited"}:  Posted,
		{"pending", "refused"}:   Voided,
		{"pending", "debited"}:   Pending,
		{"posted", "credited"}:   Posted,
		{"voided", "refused"}:    Voided,
		{"voided", "aborted"}:    Voided,
	}
	for _, s := range states {
		for _, e := range events {
			got, err := Next(s, e)
			want, ok := allowed[[2]string{string(s), string(e)}]
			if ok && (err != nil || got != want) {
				t.Errorf("Next(%s,%s) = %s,%v; want %s", s, e, got, err, want)
			}
			if !ok && err == nil {
				t.Errorf("Next(%s,%s) = %s; want an illegal-transition error", s, e, got)
			}
			if !ok && got != s {
				t.Errorf("Next(%s,%s) changed the state on error to %s", s, e, got)
			}
		}
	}
}

func TestFinalNeverLeadsToTheOtherFinal(t *testing.T) {
	// I5: never both credited and restored.
	for _, e := range []Event{Debited, Credited, Refused, Aborted} {
		if got, _ := Next(Posted, e); got == Voided {
			t.Fatalf("posted --%s--> voided", e)
		}
		if got, _ := Next(Voided, e); got == Posted {
			t.Fatalf("voided --%s--> posted", e)
		}
	}
}

func TestSplitExamples(t *testing.T) {
	cases := []struct {
		total Units
		w     []int64
		want  []Units
	}{
		{10000, []int64{40, 35, 25}, []Units{4000, 3500, 2500}},
		{10, []int64{1, 1, 1}, []Units{4, 3, 3}},
		{7, []int64{0, 1}, []Units{0, 7}},
		{0, []int64{1, 2}, []Units{0, 0}},
		{100, []int64{1, 1, 1}, []Units{34, 33, 33}},
	}
	for _, c := range cases {
		ws := make([]Weight, len(c.w))
		for i, w := range c.w {
			ws[i] = Weight{Region: string(rune('a' + i)), Weight: w}
		}
		got, err := Split(c.total, ws)
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("Split(%d,%v) = %v; want %v", c.total, c.w, got, c.want)
			}
		}
	}
	if _, err := Split(10, []Weight{{"a", 0}}); err == nil {
		t.Fatal("zero weights accepted")
	}
}

func TestSplitSumsToTotal(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := Units(rapid.Int64Range(0, 1_000_000).Draw(t, "total"))
		n := rapid.IntRange(1, 8).Draw(t, "n")
		ws := make([]Weight, n)
		var sum int64
		for i := range ws {
			ws[i] = Weight{Region: "r", Weight: rapid.Int64Range(0, 1000).Draw(t, "w")}
			sum += ws[i].Weight
		}
		parts, err := Split(total, ws)
		if sum == 0 {
			if err == nil {
				t.Fatal("zero sum accepted")
			}
			return
		}
		var got Units
		for i, p := range parts {
			if p < 0 {
				t.Fatalf("negative part %d", p)
			}
			exact := float64(total) * float64(ws[i].Weight) / float64(sum)
			if float64(p) < exact-1 || float64(p) > exact+1 {
				t.Fatalf("part %d = %d, exact share %.2f", i, p, exact)
			}
			got += p
		}
		if got != total {
			t.Fatalf("parts %v sum to %d, want %d", parts, got, total)
		}
	})
}

func TestCheckID(t *testing.T) {
	for _, bad := range []string{"", strings.Repeat("x", 10*1024), "a b", "-x", "é"} {
		if CheckID(bad) == "" {
			t.Errorf("CheckID(%.20q) accepted", bad)
		}
	}
	for _, good := range []string{"s1", "sale-2026/phone", "user@example.com", strings.Repeat("x", MaxIDLen)} {
		if r := CheckID(good); r != "" {
			t.Errorf("CheckID(%q) = %s", good, r)
		}
	}
	if CheckRegion("unallocated") == "" || CheckRegion("US") == "" || CheckRegion("us") != "" {
		t.Error("CheckRegion")
	}
}

// TestCheckText: free text a person wrote may be any printable UTF-8, but no control
// character (which would forge log lines or terminal output) and nothing too long.
func TestCheckText(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"price error on the listing", true},
		{"prix erroné — 50 % trop bas", true},
		{"", true},
		{"a\x00b", false},
		{"\x1b[31mred\x1b[0m", false},
		{"two\nlines", false},
		{"tab\there", false},
		{string([]byte{0xff, 0xfe}), false},
		{strings.Repeat("x", 1025), false},
	} {
		if got := CheckText(tc.s, 1024) == ""; got != tc.ok {
			t.Errorf("CheckText(%q) ok = %v, want %v", tc.s, got, tc.ok)
		}
	}
}

// TestAsText: what AsText makes of any string, CheckText accepts, and printable text passes
// through unchanged.
func TestAsText(t *testing.T) {
	for _, s := range []string{"total 100 != 101", "a\x00b\nc\x1b[0m", string([]byte{0xff, 'x'}), strings.Repeat("é", 600), strings.Repeat("x", 2000)} {
		got := AsText(s, 1024)
		if why := CheckText(got, 1024); why != "" {
			t.Errorf("AsText(%q) = %q, which CheckText refuses: %s", s, got, why)
		}
	}
	if got := AsText("price error — 50 %", 1024); got != "price error — 50 %" {
		t.Errorf("printable text changed: %q", got)
	}
}
