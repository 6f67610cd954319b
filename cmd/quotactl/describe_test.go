package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/spf13/cobra"
)

// TestDescribeNamesTheFlag: a server's invalid-field answer names the protocol's field; the
// CLI adds the flag of the command that set it, and only when the command has that flag.
func TestDescribeNamesTheFlag(t *testing.T) {
	reserve := &cobra.Command{Use: "reserve"}
	reserve.Flags().String("sale", "", "")
	reserve.Flags().String("request-key", "", "")
	audit := &cobra.Command{Use: "audit"}
	tests := []struct {
		cmd  *cobra.Command
		err  error
		want string // "" : no flag named
	}{
		{reserve, apierr.ToStatus(apierr.Invalid("sale_id", "empty")), "; set by --sale"},
		{reserve, fmt.Errorf("reserve: %w", apierr.ToStatus(apierr.Invalid("request_key", "too long"))), "; set by --request-key"},
		{audit, apierr.ToStatus(apierr.Invalid("sale_id", "empty")), ""},
		{reserve, apierr.ToStatus(apierr.Invalid("policy", "unknown")), ""},
		{reserve, apierr.ToStatus(fmt.Errorf("region us: %w", apierr.ErrRegionExhausted)), ""},
		{reserve, fmt.Errorf("dial: refused"), ""},
	}
	for _, tt := range tests {
		got := describeFor(tt.cmd, tt.err)
		if !strings.HasPrefix(got, describe(tt.err)) || strings.TrimPrefix(got, describe(tt.err)) != tt.want {
			t.Errorf("describeFor(%s, %v) = %q, want describe's text then %q", tt.cmd.Name(), tt.err, got, tt.want)
		}
	}
}

// TestUsageErrorNamesTheVariable: a value quotactl itself refuses names the QUOTA_* variable
// it came from, since that, not the flag, is what the user must change.
func TestUsageErrorNamesTheVariable(t *testing.T) {
	for _, tt := range []struct {
		env, value string
		args       []string
		want       string
	}{
		{"QUOTA_OUTPUT", "yaml", []string{"regions"}, "; set by QUOTA_OUTPUT (--output)"},
		{"QUOTA_TIMEOUT", "-1s", []string{"regions"}, "; set by QUOTA_TIMEOUT (--timeout)"},
		{"", "", []string{"regions", "--timeout", "-1s"}, "must be positive"}, // typed: nothing added
		{"QUOTA_CERT_WARN", "-24h", []string{"status"}, "; set by QUOTA_CERT_WARN (--cert-warn)"},
	} {
		if tt.env != "" {
			t.Setenv(tt.env, tt.value)
		}
		var out bytes.Buffer
		root := rootCmd(&out)
		root.SetErr(&out)
		root.SetArgs(tt.args)
		cmd, err := root.ExecuteC()
		if exitCode(err) != 2 || !strings.HasSuffix(describeFor(cmd, err), tt.want) {
			t.Errorf("%s=%s %v: exit %d, %q; want exit 2 ending in %q", tt.env, tt.value, tt.args, exitCode(err), describeFor(cmd, err), tt.want)
		}
		if tt.env != "" {
			t.Setenv(tt.env, "")
		}
	}
}

// TestErrorsAsJSON: with -o json an error is one JSON object (on stderr), so a script can
// read the failure as it reads the success.
func TestErrorsAsJSON(t *testing.T) {
	config := filepath.Join(t.TempDir(), "quotactl.yaml")
	if err := os.WriteFile(config, []byte("output: json\ncoordinator: 127.0.0.1:1\ntimeout: 2s\ncerts-dir: "+certs.Dir()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args     []string
		exit     int
		grpcCode string
	}{
		{[]string{"--coordinator", "127.0.0.1:1", "--timeout", "2s", "--certs-dir", certs.Dir(), "regions", "-o", "json"}, 1, "Unavailable"},
		{[]string{"--coordinator", "127.0.0.1:1", "--certs-dir", "/nonexistent", "regions", "-o", "json"}, 2, ""},
		{[]string{"regions", "-o", "json", "--timeout", "-1s"}, 2, ""},
		{[]string{"regions", "--bogus", "-o", "json"}, 2, ""}, // refused before -o is parsed
		{[]string{"-o", "json", "bogus"}, 2, ""},
		// output: json in the config file, for errors before the file is read too
		{[]string{"--config", config, "regions"}, 1, "Unavailable"},
		{[]string{"--config", config, "regions", "--bogus"}, 2, ""},
		{[]string{"regions", "--bogus", "--config=" + config}, 2, ""},
	} {
		var out bytes.Buffer
		root := rootCmd(&out)
		root.SetErr(&out)
		root.SetArgs(tt.args)
		cmd, err := root.ExecuteC()
		var buf bytes.Buffer
		printError(&buf, cmd, err, exitCode(err), wantsJSON(cmd, tt.args))
		var got errorJSON
		if jerr := json.Unmarshal(buf.Bytes(), &got); jerr != nil || got.ExitCode != tt.exit || got.Code != tt.grpcCode || got.Error == "" {
			t.Errorf("%v: %q (%v); want exit_code %d, code %q and the error text", tt.args, buf.String(), jerr, tt.exit, tt.grpcCode)
		}
	}
}

// TestConfigKeysListEveryFlag: as for quotad, every quotactl flag is a key a config file may
// carry.
func TestConfigKeysListEveryFlag(t *testing.T) {
	if m := cliconf.MissingKeys(rootCmd(io.Discard)); len(m) > 0 {
		t.Errorf("flags missing from cliconf's programKeys: %v", m)
	}
}
