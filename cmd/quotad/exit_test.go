package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
)

// TestBadUsageExitsTwo: a bad command, flag or setting is exit 2, as for quotactl, and
// nothing starts; a failure while running stays 1.
func TestBadUsageExitsTwo(t *testing.T) {
	for _, args := range [][]string{
		{"bogus"},
		{"dev", "base-port", "24800"}, // dashes forgotten: must not start a cluster on the defaults
		{"region", "extra"},
		{"coordinator", "extra"},
		{"region", "--bogus"},
		{"region", "--etcd", "http://127.0.0.1:1"}, // no --name
		{"dev", "--base-port", "-1"},
		{"coordinator", "--region", "us=a"},
		{"region", "--name", "us", "--db-url", "postgres://q@h/db", "--max-batch", "-1"},
		{"region", "--name", "us", "--db-url", "postgres://q@h/db", "--retain-closed", "0s"},
		{"dev", "--retain-closed", "-1m"},
		{"region", "--name", "us", "--db-url", "postgres://q@h/db", "--standby-refresh", "-1s"},
		{"dev", "--standby-refresh", "500us"},
		{"dev", "--max-keys-per-user", "0"},
		{"region", "--name", "us", "--db-url", "postgres://q@h/db", "--max-keys-per-user", "-1"},
		{"region", "--name", "us", "--db-url", "postgres://q@h/db", "--insecure", "--room-listen", "127.0.0.1:0"}, // no --ticket-keys
		{"dev", "--rebalance-every", "1ms"},
		{"dev", "--rebalance-max-in-flight", "0"},
		{"dev", "--rebalance-min-units", "0"},
		{"dev", "--max-connections-per-ip", "0"},
		{"dev", "--max-connections-per-cert", "5000"},
		{"coordinator", "--db-url", "postgres://q@h/db", "--region", "us=a:1=postgres://q@h/r", "--insecure", "--rebalance-window", "0s"},
		{"coordinator", "--db-url", "postgres://q@h/db", "--region", "us=a:1=postgres://q@h/r", "--insecure", "--rebalance-max-in-flight", "101"},
	} {
		root := rootCmd()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if err == nil || exitCode(err) != 2 {
			t.Errorf("quotad %v: %v (exit %d), want a usage error, exit 2", args, err, exitCode(err))
		}
	}
	if got := exitCode(errors.New("listen tcp: address already in use")); got != 1 {
		t.Errorf("a runtime failure: exit %d, want 1", got)
	}
}

// TestConfigKeysListEveryFlag: a config file may carry any flag of quotad or quotactl; the
// list of those keys must name every quotad flag, or a file setting it would be refused.
func TestConfigKeysListEveryFlag(t *testing.T) {
	if m := cliconf.MissingKeys(rootCmd()); len(m) > 0 {
		t.Errorf("flags missing from cliconf's programKeys: %v", m)
	}
}

// TestAdvertiseChecked: an --advertise address that others could not dial is refused with
// the reason; a host name or an IP with a port passes, and so does none.
func TestAdvertiseChecked(t *testing.T) {
	for addr, want := range map[string]string{
		"":                                       "",
		"quota-region-us-0.quota-region-us:7401": "",
		"10.0.0.7:7401":                          "",
		"[2001:db8::1]:7401":                     "",
		"quota-region-us-0":                      "want host:port",
		":7401":                                  "the host is empty",
		"0.0.0.0:7401":                           "is a wildcard",
		"[::]:7401":                              "is a wildcard",
		"h:0":                                    "want 1 to 65535",
		"h:http":                                 "want 1 to 65535",
	} {
		err := checkAdvertise(addr)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("--advertise %q: %v, want %q", addr, err, want)
		}
	}
}
