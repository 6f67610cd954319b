package cliconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

// bindCommand parses args for a command with a few typed flags and binds its settings.
func bindCommand(t *testing.T, args ...string) (*viper.Viper, error) {
	t.Helper()
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	f := cmd.Flags()
	f.String("config", "", "")
	f.Duration("timeout", 30*time.Second, "")
	f.Bool("dry-run", false, "")
	f.Int64("quantity", 1, "")
	f.StringSlice("regions", []string{"us"}, "")
	f.Int("max-batch", 256, "")
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	return Bind(cmd)
}

// A setting from a QUOTA_* variable or a config file is parsed as its flag would be: a bad
// value is an error naming where it came from and which flag, never a silent zero or false.
func TestSettingsParseLikeTheirFlags(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("timeout: 5\nquantity: 3\nregions: [eu, ap]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		env, value, want string
		args             []string
	}{
		{"QUOTA_TIMEOUT", "abc", `QUOTA_TIMEOUT="abc": not a valid --timeout`, nil},
		{"QUOTA_DRY_RUN", "maybe", `QUOTA_DRY_RUN="maybe": not a valid --dry-run`, nil},
		{"QUOTA_QUANTITY", "abc", `QUOTA_QUANTITY="abc": not a valid --quantity`, nil},
		{"", "", `config key timeout="5": not a valid --timeout`, []string{"--config", cfg}},
	}
	for _, c := range bad {
		if c.env != "" {
			t.Setenv(c.env, c.value)
		}
		_, err := bindCommand(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%q %v: %v; want an error containing %q", c.env, c.value, c.args, err, c.want)
		}
		if c.env != "" {
			t.Setenv(c.env, "") // empty: unset, for viper and here
		}
	}
	// Good values, and the order: flag over variable over file.
	t.Setenv("QUOTA_TIMEOUT", "7s")
	t.Setenv("QUOTA_DRY_RUN", "true")
	v, err := bindCommand(t, "--config", cfg, "--quantity", "4")
	if err != nil {
		t.Fatal(err)
	}
	if got := v.GetDuration("timeout"); got != 7*time.Second {
		t.Errorf("timeout %v, want 7s from QUOTA_TIMEOUT over the file's bad 5", got)
	}
	if !v.GetBool("dry-run") || v.GetInt64("quantity") != 4 || strings.Join(v.GetStringSlice("regions"), ",") != "eu,ap" {
		t.Errorf("dry-run %v quantity %d regions %v; want true, 4 (flag over file), [eu ap] (file)",
			v.GetBool("dry-run"), v.GetInt64("quantity"), v.GetStringSlice("regions"))
	}
	t.Setenv("QUOTA_QUANTITY", "abc")
	if _, err := bindCommand(t, "--quantity", "2"); err != nil {
		t.Errorf("a bad QUOTA_QUANTITY under an explicit --quantity: %v; the flag wins, nothing to parse", err)
	}
}

// Lists keep viper's forms: a variable's words split on spaces (and commas), a file's list element by
// element (an element may hold a comma); a JSON number of a million or more is a number.
func TestSettingsListsAndNumbers(t *testing.T) {
	t.Setenv("QUOTA_REGIONS", "eu ap")
	v, err := bindCommand(t)
	if err != nil || strings.Join(v.GetStringSlice("regions"), "|") != "eu|ap" {
		t.Fatalf("QUOTA_REGIONS=\"eu ap\": %v, %v; want [eu ap]", v.GetStringSlice("regions"), err)
	}
	t.Setenv("QUOTA_REGIONS", "eu,ap")
	if v, err := bindCommand(t); err != nil || strings.Join(v.GetStringSlice("regions"), "|") != "eu|ap" {
		t.Fatalf("QUOTA_REGIONS=eu,ap: %v, %v; want [eu ap], as --regions eu,ap", v.GetStringSlice("regions"), err)
	}
	t.Setenv("QUOTA_REGIONS", "")
	cfg := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(cfg, []byte(`{"regions": ["a,b", "c"], "max-batch": 2000000, "quantity": 3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err = bindCommand(t, "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.GetStringSlice("regions"); len(got) != 2 || got[0] != "a,b" || got[1] != "c" {
		t.Errorf("config regions [\"a,b\", \"c\"]: %q", got)
	}
	if v.GetInt("max-batch") != 2000000 || v.GetInt64("quantity") != 3 {
		t.Errorf("max-batch %d, quantity %d; want 2000000 and 3", v.GetInt("max-batch"), v.GetInt64("quantity"))
	}
}

// TestSourceNamesWhereAValueCameFrom: an error about a value names the flag, and the variable
// or config key too when the value came from there, since that is what the user must change.
func TestSourceNamesWhereAValueCameFrom(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("quantity: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("QUOTA_MAX_BATCH", "9")
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	f := cmd.Flags()
	f.String("config", "", "")
	f.Int64("quantity", 1, "")
	f.Int("max-batch", 256, "")
	f.String("sale", "", "")
	f.String("sku", "phone", "")
	cmd.SetArgs([]string{"--config", cfg, "--sale", "s1"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if _, err := Bind(cmd); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"sale":      "--sale",
		"sku":       "--sku", // the default
		"max-batch": "QUOTA_MAX_BATCH (--max-batch)",
		"quantity":  "config key quantity (--quantity)",
	} {
		if got := Source(f.Lookup(name)); got != want {
			t.Errorf("Source(--%s) = %q, want %q", name, got, want)
		}
	}
}

// TestUnknownConfigKeyIsAnError: a misspelled key fails, naming it; a key of another
// command's flag is allowed, since one file may serve several commands.
func TestUnknownConfigKeyIsAnError(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"quantity: 3\nunits: 5\n", ""},        // units: the sibling's flag
		{"quantity: 3\nbase-port: 7400\n", ""}, // the other program's flag
		{"quantity:\n  phone: 5\n", "key quantity: want a value or a list, not a map"},
		{"quantity: 3\nbogus-key: 1\nquantty: 2\n", "unknown key bogus-key, quantty"}, // typos
	} {
		cfg := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(cfg, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		root := &cobra.Command{Use: "root"}
		root.PersistentFlags().String("config", "", "")
		var bindErr error
		reserve := &cobra.Command{Use: "reserve", RunE: func(c *cobra.Command, _ []string) error { _, bindErr = Bind(c); return nil }}
		reserve.Flags().Int64("quantity", 1, "")
		transfer := &cobra.Command{Use: "transfer"}
		transfer.Flags().Int64("units", 0, "")
		root.AddCommand(reserve, transfer)
		root.SetArgs([]string{"reserve", "--config", cfg})
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		if tc.want == "" && bindErr != nil {
			t.Errorf("%q: %v, want no error", tc.file, bindErr)
		}
		if tc.want != "" && (bindErr == nil || !strings.Contains(bindErr.Error(), tc.want)) {
			t.Errorf("%q: %v, want an error containing %q", tc.file, bindErr, tc.want)
		}
	}
}
