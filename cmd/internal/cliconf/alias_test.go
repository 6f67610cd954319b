package cliconf

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

// aliasCommand parses args for a command whose flags --request-key, --console-keys,
// --duration, --dry-run and --regions have the deprecated names --key, --keys,
// --max-duration, --preview and --region-list, and binds its settings. It returns what the
// command wrote to stderr.
func aliasCommand(t *testing.T, args ...string) (*viper.Viper, *cobra.Command, string, error) {
	t.Helper()
	root := &cobra.Command{Use: "prog"}
	root.PersistentFlags().String("config", "", "")
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	f := cmd.Flags()
	f.String("request-key", "", "")
	f.Duration("duration", 5*time.Minute, "")
	f.Bool("dry-run", false, "")
	f.StringSlice("regions", []string{"us"}, "")
	Alias(f, "key", "request-key")
	Alias(f, "max-duration", "duration")
	Alias(f, "preview", "dry-run")
	Alias(f, "region-list", "regions")
	group := &cobra.Command{Use: "console"}
	group.PersistentFlags().String("console-keys", ".dev/console.keys", "")
	Alias(group.PersistentFlags(), "keys", "console-keys")
	group.AddCommand(cmd)
	root.AddCommand(group)
	var stderr bytes.Buffer
	root.SetErr(&stderr)
	root.SetOut(&stderr)
	root.SetArgs(append([]string{"console", "x"}, args...))
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	v, err := Bind(cmd)
	return v, cmd, stderr.String(), err
}

// Every deprecated name still sets its flag, on the command line, and says once on stderr
// that it is deprecated and what replaces it; the new name works and warns of nothing.
func TestAliasSetsTheFlagAndWarns(t *testing.T) {
	v, cmd, stderr, err := aliasCommand(t, "--key", "k1", "--keys", "c.keys", "--max-duration", "2s", "--preview", "--region-list", "eu,ap")
	if err != nil {
		t.Fatal(err)
	}
	if v.GetString("request-key") != "k1" || v.GetString("console-keys") != "c.keys" || v.GetDuration("duration") != 2*time.Second ||
		!v.GetBool("dry-run") || strings.Join(v.GetStringSlice("regions"), ",") != "eu,ap" {
		t.Errorf("through the old names: request-key %q console-keys %q duration %v dry-run %v regions %v",
			v.GetString("request-key"), v.GetString("console-keys"), v.GetDuration("duration"), v.GetBool("dry-run"), v.GetStringSlice("regions"))
	}
	for old, name := range map[string]string{"key": "request-key", "keys": "console-keys", "max-duration": "duration", "preview": "dry-run", "region-list": "regions"} {
		want := "prog: --" + old + " is deprecated and goes in the next release: use --" + name + "\n"
		if strings.Count(stderr, want) != 1 {
			t.Errorf("stderr %q: want the line %q once", stderr, want)
		}
	}
	if got := Source(cmd.Flags().Lookup("request-key")); got != "--key (--request-key)" {
		t.Errorf("Source(--request-key) set by --key = %q, want it to name --key", got)
	}
	if !cmd.Flags().Lookup("key").Hidden {
		t.Error("--key is shown in the help; want it hidden")
	}

	v, _, stderr, err = aliasCommand(t, "--request-key", "k2", "--console-keys", "d.keys", "--duration", "3s", "--dry-run")
	if err != nil || v.GetString("request-key") != "k2" || v.GetString("console-keys") != "d.keys" || v.GetDuration("duration") != 3*time.Second || !v.GetBool("dry-run") {
		t.Errorf("new names: %v, request-key %q console-keys %q duration %v", err, v.GetString("request-key"), v.GetString("console-keys"), v.GetDuration("duration"))
	}
	if stderr != "" {
		t.Errorf("new names wrote %q to stderr, want nothing", stderr)
	}
	if v, _, _, err := aliasCommand(t); err != nil || v.GetString("console-keys") != ".dev/console.keys" || v.GetDuration("duration") != 5*time.Minute {
		t.Errorf("no flag: %v, console-keys %q duration %v; want the defaults", err, v.GetString("console-keys"), v.GetDuration("duration"))
	}
}

// The old and the new name with different values is an error naming both; with the same
// value it is only the warning.
func TestAliasAndNameDisagreeing(t *testing.T) {
	for _, args := range [][]string{
		{"--key", "k1", "--request-key", "k2"},
		{"--request-key", "k2", "--key", "k1"},
	} {
		_, _, _, err := aliasCommand(t, args...)
		if err == nil || !strings.Contains(err.Error(), `--key "k1"`) || !strings.Contains(err.Error(), `--request-key "k2"`) {
			t.Errorf("%v: %v; want an error naming --key and --request-key", args, err)
		}
	}
	_, _, _, err := aliasCommand(t, "--max-duration", "2s", "--duration", "3s")
	if err == nil || !strings.Contains(err.Error(), "--max-duration") || !strings.Contains(err.Error(), "--duration") {
		t.Errorf("--max-duration 2s --duration 3s: %v; want an error naming both", err)
	}
	v, _, stderr, err := aliasCommand(t, "--key", "k1", "--request-key", "k1")
	if err != nil || v.GetString("request-key") != "k1" || !strings.Contains(stderr, "--key is deprecated") {
		t.Errorf("--key k1 --request-key k1: %v, %q, stderr %q; want k1 and the warning", err, v.GetString("request-key"), stderr)
	}
}

// The old name is also a QUOTA_* variable and a config file key, with the same warning in
// the same terms; where both names are set, the usual order decides (command line, then
// variable, then file), and two values at one level are an error.
func TestAliasInTheEnvironmentAndTheConfigFile(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("keys: file.keys\nmax-duration: 4s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("QUOTA_KEY", "env-key")
	v, cmd, stderr, err := aliasCommand(t, "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if v.GetString("request-key") != "env-key" || v.GetString("console-keys") != "file.keys" || v.GetDuration("duration") != 4*time.Second {
		t.Errorf("request-key %q console-keys %q duration %v; want env-key (QUOTA_KEY), file.keys and 4s (config keys)",
			v.GetString("request-key"), v.GetString("console-keys"), v.GetDuration("duration"))
	}
	for _, want := range []string{
		"prog: QUOTA_KEY is deprecated and goes in the next release: use QUOTA_REQUEST_KEY\n",
		"prog: config key keys is deprecated and goes in the next release: use config key console-keys\n",
		"prog: config key max-duration is deprecated and goes in the next release: use config key duration\n",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q: want %q", stderr, want)
		}
	}
	if got := Source(cmd.Flags().Lookup("request-key")); got != "QUOTA_KEY (--request-key)" {
		t.Errorf("Source = %q, want QUOTA_KEY (--request-key)", got)
	}
	// The command line over the variable over the file, whichever name each uses.
	t.Setenv("QUOTA_CONSOLE_KEYS", "env.keys")
	v, _, _, err = aliasCommand(t, "--config", cfg, "--max-duration", "9s")
	if err != nil || v.GetString("console-keys") != "env.keys" || v.GetDuration("duration") != 9*time.Second {
		t.Errorf("%v: console-keys %q duration %v; want env.keys (QUOTA_CONSOLE_KEYS over config key keys), 9s (--max-duration over config key max-duration)",
			err, v.GetString("console-keys"), v.GetDuration("duration"))
	}
	if v, _, _, err := aliasCommand(t, "--request-key", "flag-key"); err != nil || v.GetString("request-key") != "flag-key" {
		t.Errorf("--request-key over QUOTA_KEY: %v, %q", err, v.GetString("request-key"))
	}
	t.Setenv("QUOTA_REQUEST_KEY", "other")
	if _, _, _, err := aliasCommand(t); err == nil || !strings.Contains(err.Error(), `QUOTA_KEY "env-key" and QUOTA_REQUEST_KEY "other"`) {
		t.Errorf("QUOTA_KEY and QUOTA_REQUEST_KEY disagreeing: %v; want an error naming both", err)
	}
}

func TestAliasOfAMissingFlagPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Alias of a missing flag did not panic")
		}
	}()
	cmd := &cobra.Command{Use: "x"}
	Alias(cmd.Flags(), "old", "nosuch")
}
