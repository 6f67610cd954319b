package cliconf

import (
	"strings"
	"testing"

	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/spf13/cobra"
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

func gcCommand(t *testing.T, args ...string) (gcconf.Config, error) {
	t.Helper()
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	cmd.Flags().String("config", "", "")
	AddGCFlags(cmd.Flags())
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	v, err := Bind(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return GC(cmd, v)
}

// The defaults apply unless Go's own variables are set; a setting given explicitly wins
// over those.
func TestGCYieldsToGoEnvironmentUnlessExplicit(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	if c, err := gcCommand(t); err != nil || c != gcconf.Default() {
		t.Fatalf("no flags, no Go variables: %+v, %v; want the defaults", c, err)
	}
	t.Setenv("GOGC", "250")
	t.Setenv("GOMEMLIMIT", "2GiB")
	if c, err := gcCommand(t); err != nil || c != gcconf.Current() {
		t.Fatalf("Go variables set: %+v, %v; want the runtime's own setting %+v", c, err, gcconf.Current())
	}
	c, err := gcCommand(t, "--gc-percent", "300", "--memory-limit", "1GiB")
	if err != nil || c != (gcconf.Config{Percent: 300, MemoryLimit: 1 << 30}) {
		t.Fatalf("explicit flags: %+v, %v", c, err)
	}
	if _, err := gcCommand(t, "--gc-percent", "0"); err == nil || !strings.Contains(err.Error(), "gc-percent 0") {
		t.Fatalf("explicit --gc-percent 0 with GOGC set: %v; want it refused", err)
	}
	t.Setenv("QUOTA_MEMORY_LIMIT", "512MiB")
	if c, err := gcCommand(t); err != nil || c.MemoryLimit != 512<<20 {
		t.Fatalf("QUOTA_MEMORY_LIMIT: %+v, %v; want 512 MiB", c, err)
	}
}
