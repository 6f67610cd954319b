package main

import (
	"io"
	"strings"
	"testing"
)

// TestEtcdTLSUsageErrors: TLS and plaintext do not mix, and the error names the flag; none
// of these starts a member or dials etcd.
func TestEtcdTLSUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"etcd", "--name", "e1", "--data-dir", dir, "--initial-cluster", "e1=http://127.0.0.1:2380"}, "certs-dir"},
		{[]string{"etcd", "--insecure", "--name", "e1", "--data-dir", dir, "--client-url", "https://127.0.0.1:2379",
			"--initial-cluster", "e1=http://127.0.0.1:2380"}, "client-url"},
		{[]string{"region", "--insecure", "--name", "us", "--db-url", "postgres://q@h/db", "--etcd", "https://127.0.0.1:1"}, "--certs-dir"},
		{[]string{"coordinator", "--insecure", "--db-url", "postgres://q@h/db", "--region", "us=127.0.0.1:1=postgres://q@h/us",
			"--etcd", "https://127.0.0.1:1,http://127.0.0.1:2"}, "etcd"},
	} {
		root := rootCmd()
		root.SetArgs(c.args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("quotad %v: %v (exit %d), want a usage error naming %s", c.args, err, exitCode(err), c.want)
		}
	}
}
