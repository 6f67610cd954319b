package cliconf

import (
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"0", 0, ""},
		{"1234", 1234, ""},
		{"900MiB", 900 << 20, ""},
		{" 2GiB ", 2 << 30, ""},
		{"64KiB", 64 << 10, ""},
		{"10B", 10, ""},
		{"1.5GiB", 0, "not a size"},
		{"-1MiB", 0, "not a size"},
		{"12MB", 0, "not a size"},
		{"", 0, "not a size"},
		{"9999999999999GiB", 0, "not a size"},
	} {
		got, err := ParseBytes(tc.in)
		if tc.err == "" && (err != nil || got != tc.want) || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestFormatBytesRoundTrips(t *testing.T) {
	for _, n := range []int64{0, 1, 1023, 1024, 900 << 20, 3 << 30, 1<<20 + 1} {
		s := FormatBytes(n)
		if got, err := ParseBytes(s); err != nil || got != n {
			t.Errorf("ParseBytes(FormatBytes(%d) = %q) = %d, %v", n, s, got, err)
		}
	}
	if got := FormatBytes(900 << 20); got != "900MiB" {
		t.Errorf("FormatBytes(900 MiB) = %q", got)
	}
}
