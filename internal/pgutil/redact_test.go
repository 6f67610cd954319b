package pgutil

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRedactHidesPasswords: a password in a postgres URL or a key=value DSN never appears in
// redact's output, nor in the error of any function that reports a URL it was given (no
// server listens on port 1, so every connection fails).
func TestRedactHidesPasswords(t *testing.T) {
	const secret = "s3cr3t-Pw"
	for _, tc := range []struct {
		name, dsn string
		keep      string // what the redacted form still shows
	}{
		{"url", "postgres://quota:" + secret + "@127.0.0.1:1/quota_x", "quota"},
		{"postgresql url", "postgresql://quota:" + secret + "@127.0.0.1:1/quota_x?sslmode=disable", "127.0.0.1:1"},
		{"url, escaped password", "postgres://quota:" + secret + "%2F%40@127.0.0.1:1/quota_x", "127.0.0.1:1"},
		{"url, bad escape in password", "postgres://quota:" + secret + "%zz@127.0.0.1:1/quota_x", ""},
		{"url, password in query", "postgres://quota@127.0.0.1:1/quota_x?password=" + secret, "127.0.0.1:1"},
		{"dsn", "host=127.0.0.1 port=1 user=quota password=" + secret + " dbname=quota_x", "host=127.0.0.1"},
		{"dsn, quoted", "host=127.0.0.1 port=1 user=quota password='" + secret + " x' dbname=quota_x", "user=quota"},
		{"dsn, spaces around =", "host=127.0.0.1 port=1 password = " + secret + " user=quota", "user=quota"},
		{"dsn, upper case key", "host=127.0.0.1 port=1 PASSWORD=" + secret, "host=127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := redact(tc.dsn)
			if strings.Contains(got, secret) {
				t.Errorf("redact(%q) = %q: shows the password", tc.dsn, got)
			}
			if !strings.Contains(got, tc.keep) {
				t.Errorf("redact(%q) = %q: want it to keep %q", tc.dsn, got, tc.keep)
			}
			for _, err := range errorsFor(tc.dsn) {
				if err == nil {
					t.Errorf("%q: no error from a server that is not there", tc.dsn)
				} else if strings.Contains(err.Error(), secret) {
					t.Errorf("error shows the password: %v", err)
				}
			}
		})
	}
}

// errorsFor are the errors of the package's functions given dsn, for a server that is not there.
func errorsFor(dsn string) []error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, open := Open(ctx, dsn, 1)
	errs := []error{open, EnsureDatabase(ctx, dsn, "quota_x"), DropDatabase(ctx, dsn, "quota_x")}
	if strings.Contains(dsn, "://") {
		_, with := WithDatabase(strings.Replace(dsn, "postgres", "mysql", 1), "quota_y")
		errs = append(errs, with)
	}
	return errs
}
