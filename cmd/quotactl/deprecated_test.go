package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// warned tells whether out has quotactl's one-line warning that --old is deprecated, naming
// --name.
func warned(out, old, name string) bool {
	return strings.Count(out, "quotactl: --"+old+" is deprecated and goes in the next release: use --"+name+"\n") == 1
}

// TestDeprecatedRequestKeyNames: reserve's --key and the --request-id of transfer, rebalance
// and sale create still work as --request-key, each warning once on stderr; the old and the
// new name with different values are refused, naming both.
func TestDeprecatedRequestKeyNames(t *testing.T) {
	d := startDev(t, "us", "eu")
	coord := "--coordinator=" + d.Coordinator.Addr()
	out, err := run(t, coord, "sale", "create", "--sale", "dep", "--sku", "phone=100", "--allocate", "us=1,eu=1", "--request-id", "alloc-dep-1", "-o", "json")
	if err != nil || !warned(out, "request-id", "request-key") || !strings.Contains(out, `"transfers": [`) {
		t.Fatalf("sale create --request-id: %v\n%s; want the allocation made and the warning", err, out)
	}
	// The same key under the new name replays the allocation: the alias set the same key.
	out, err = run(t, coord, "sale", "create", "--sale", "dep", "--sku", "phone=100", "--allocate", "us=1,eu=1", "--request-key", "alloc-dep-1", "-o", "json")
	if err != nil || strings.Contains(out, "deprecated") || !strings.Contains(out, `"replayed": true`) {
		t.Errorf("sale create --request-key of the same key: %v\n%s; want a replay, no warning", err, out)
	}
	out, err = run(t, coord, "reserve", "--region", "us", "--sale", "dep", "--sku", "phone", "--user", "u1", "--key", "k1", "-o", "json")
	if err != nil || !warned(out, "key", "request-key") || !strings.Contains(out, `"request_key": "k1"`) {
		t.Errorf("reserve --key k1: %v\n%s; want a hold of request key k1 and the warning", err, out)
	}
	out, err = run(t, coord, "transfer", "--sale", "dep", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1", "--request-id", "dep-move", "-o", "json")
	if err != nil || !warned(out, "request-id", "request-key") || strings.Contains(out, "request key manual-") {
		t.Fatalf("transfer --request-id dep-move: %v\n%s; want the transfer under that key and the warning", err, out)
	}
	out, err = run(t, coord, "transfer", "--sale", "dep", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1", "--request-key", "dep-move", "-o", "json")
	if err != nil || !strings.Contains(out, `"replayed": true`) {
		t.Errorf("transfer --request-key dep-move after --request-id dep-move: %v\n%s; want the same transfer, replayed", err, out)
	}
	out, err = run(t, coord, "rebalance", "--sale", "dep", "--sku", "phone", "--dry-run", "--request-id", "dep-rb", "-o", "json")
	if err != nil || !warned(out, "request-id", "request-key") {
		t.Errorf("rebalance --request-id: %v\n%s; want it to run, with the warning", err, out)
	}
	for _, args := range [][]string{
		{"reserve", "--region", "us", "--sale", "dep", "--sku", "phone", "--user", "u1", "--key", "k1", "--request-key", "k2"},
		{"transfer", "--sale", "dep", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1", "--request-id", "a", "--request-key", "b"},
	} {
		old := "--" + map[string]string{"reserve": "key", "transfer": "request-id"}[args[0]]
		_, err := run(t, append([]string{coord}, args...)...)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), old+` "`) || !strings.Contains(err.Error(), `--request-key "`) {
			t.Errorf("%v: exit %d (%v); want 2, naming %s and --request-key", args, exitCode(err), err, old)
		}
	}
}

// TestDeprecatedKeyFileNames: ticket-keys' --file and console's --keys still name the key
// file, as --ticket-keys and --console-keys (quotad's names of the same files), on the
// command line, as a QUOTA_* variable and as a config file key, each warning once.
func TestDeprecatedKeyFileNames(t *testing.T) {
	for _, tc := range []struct{ cmd, old, name, list string }{
		{"ticket-keys", "file", "ticket-keys", "list"},
		{"console keys", "keys", "console-keys", "rotate"},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "k")
		args := func(verb string, more ...string) []string {
			return append(append(strings.Fields(tc.cmd), verb), more...)
		}
		out, err := run(t, args("create", "--"+tc.old, path)...)
		if err != nil || !warned(out, tc.old, tc.name) {
			t.Fatalf("%s create --%s: %v\n%s; want the file made and the warning", tc.cmd, tc.old, err, out)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("%s create --%s %s made no file: %v", tc.cmd, tc.old, path, err)
		}
		if out, err := run(t, args(tc.list, "--"+tc.name, path)...); err != nil || strings.Contains(out, "deprecated") {
			t.Errorf("%s %s --%s: %v\n%s; want it to read the file, no warning", tc.cmd, tc.list, tc.name, err, out)
		}
		_, err = run(t, args(tc.list, "--"+tc.old, path, "--"+tc.name, path+".other")...)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "--"+tc.old+` "`) || !strings.Contains(err.Error(), "--"+tc.name+` "`) {
			t.Errorf("%s %s with --%s and --%s disagreeing: exit %d (%v); want 2 naming both", tc.cmd, tc.list, tc.old, tc.name, exitCode(err), err)
		}
		// The old config key: the file is found, and the warning names the key to use.
		cfg := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(cfg, []byte(tc.old+": "+path+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err = run(t, args(tc.list, "--config", cfg)...)
		want := "quotactl: config key " + tc.old + " is deprecated and goes in the next release: use config key " + tc.name + "\n"
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("%s %s with config key %s: %v\n%s; want it to read the file and %q", tc.cmd, tc.list, tc.old, err, out, want)
		}
	}
	t.Setenv("QUOTA_FILE", filepath.Join(t.TempDir(), "missing.keys"))
	_, err := run(t, "ticket-keys", "list")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--ticket-keys") || !strings.Contains(err.Error(), "missing.keys") {
		t.Errorf("ticket-keys list with QUOTA_FILE naming a missing file: exit %d (%v); want 2, reading that file", exitCode(err), err)
	}
}

// TestDeprecatedDurationName: load's --max-duration still sets the cap on the load, now
// --duration as in quotactl bench: its value is the one checked, under the new name.
func TestDeprecatedDurationName(t *testing.T) {
	base := []string{"--coordinator", "127.0.0.1:1", "load", "--sale", "s", "--sku", "phone"}
	out, err := run(t, append(base, "--max-duration", "-1s")...)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--duration -1s: must not be negative") || !warned(out, "max-duration", "duration") {
		t.Errorf("load --max-duration -1s: exit %d (%v)\n%s; want 2 refusing --duration -1s, and the warning", exitCode(err), err, out)
	}
	out, err = run(t, append(base, "--duration", "-2s")...)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--duration -2s: must not be negative") || strings.Contains(out, "deprecated") {
		t.Errorf("load --duration -2s: exit %d (%v)\n%s; want 2 refusing it, no warning", exitCode(err), err, out)
	}
	_, err = run(t, append(base, "--max-duration", "1m", "--duration", "2m")...)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), `--max-duration "1m0s"`) || !strings.Contains(err.Error(), `--duration "2m0s"`) {
		t.Errorf("load --max-duration 1m --duration 2m: exit %d (%v); want 2 naming both", exitCode(err), err)
	}
}
