package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/trust"
)

// TestConsoleTokens: console keys create makes a 0600 key file and refuses to replace it;
// console token signs a token of the role that the console's check accepts, before and
// after a rotation; bad roles and TTLs are usage errors.
func TestConsoleTokens(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "console.keys")
	if out, err := run(t, "console", "keys", "create", "--console-keys", keys); err != nil {
		t.Fatalf("keys create: %v\n%s", err, out)
	}
	if st, err := os.Stat(keys); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v; want 0600", err, st.Mode())
	}
	if _, err := run(t, "console", "keys", "create", "--console-keys", keys); exitCode(err) != 2 {
		t.Fatalf("keys create over an existing file: exit %d (%v); want 2", exitCode(err), err)
	}
	out, err := run(t, "console", "token", "--role", "auditor", "--name", "alice", "--ttl", "2h", "--console-keys", keys, "-o", "json")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, out)
	}
	var got struct{ Token, Role, Name string }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := run(t, "console", "keys", "rotate", "--console-keys", keys); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(keys)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := admission.ParseKeyring(data)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := coordhttp.VerifyToken(ring, got.Token, time.Now())
	if err != nil || tok.Role != trust.Auditor || tok.Name != "alice" || time.Until(tok.Expires) > 2*time.Hour {
		t.Fatalf("the token after a rotation: %+v, %v", tok, err)
	}
	for _, bad := range [][]string{{"--role", "storefront"}, {"--role", "operator", "--ttl", "0s"}, {"--role", "operator", "--ttl", "200h"},
		{"--role", "operator", "--name", "a b"}} {
		if out, err := run(t, append([]string{"console", "token", "--console-keys", keys}, bad...)...); exitCode(err) != 2 {
			t.Errorf("token %v: exit %d (%v)\n%s; want a usage error", bad, exitCode(err), err, out)
		}
	}
	if out, err := run(t, "console", "token", "--role", "operator", "--console-keys", keys+".missing"); exitCode(err) != 2 ||
		!strings.Contains(err.Error(), "console keys create") {
		t.Fatalf("token without a key file: exit %d (%v)\n%s; want a usage error saying how to make one", exitCode(err), err, out)
	}
}

// TestKeyFiles: ticket-keys and console keys share one create and one rotate: each makes a
// 0600 file of one key, refuses to replace it without --overwrite (naming its flag and what
// replacing it ends), rotates it to two keys, and refuses to rotate a missing file naming the
// flag.
func TestKeyFiles(t *testing.T) {
	for _, tc := range []struct{ cmd, flag, lost string }{
		{"ticket-keys", "ticket-keys", "tickets signed with its keys stop working"},
		{"console keys", "console-keys", "tokens signed with its keys stop logging in"},
	} {
		path := filepath.Join(t.TempDir(), "k")
		args := func(verb string, more ...string) []string {
			return append(append(strings.Fields(tc.cmd), verb, "--"+tc.flag, path), more...)
		}
		if out, err := run(t, args("create")...); err != nil {
			t.Fatalf("%s create: %v\n%s", tc.cmd, err, out)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want 0600", tc.cmd, err, st.Mode())
		}
		_, err := run(t, args("create")...)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "--"+tc.flag) || !strings.Contains(err.Error(), tc.lost) {
			t.Errorf("%s create over a file: exit %d (%v); want 2 naming --%s and %q", tc.cmd, exitCode(err), err, tc.flag, tc.lost)
		}
		if out, err := run(t, args("create", "--overwrite")...); err != nil {
			t.Errorf("%s create --overwrite: %v\n%s", tc.cmd, err, out)
		}
		if out, err := run(t, args("rotate")...); err != nil {
			t.Fatalf("%s rotate: %v\n%s", tc.cmd, err, out)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if ring, err := admission.ParseKeyring(data); err != nil || len(ring.IDs()) != 2 {
			t.Errorf("%s after a rotation: %v, %v; want two keys", tc.cmd, ring, err)
		}
		path += ".missing"
		if _, err := run(t, args("rotate")...); exitCode(err) != 2 || !strings.Contains(err.Error(), "--"+tc.flag) {
			t.Errorf("%s rotate of a missing file: exit %d (%v); want 2 naming --%s", tc.cmd, exitCode(err), err, tc.flag)
		}
	}
}
