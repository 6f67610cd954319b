package cluster

import "testing"

// TestHosts: a URL's distinct servers, whatever TLS modes pgconn tries for each.
func TestHosts(t *testing.T) {
	for _, c := range []struct {
		url  string
		want int
	}{
		{"postgres://quota@127.0.0.1:5432/db", 1},
		{"postgres://quota@127.0.0.1:5432/db?sslmode=prefer", 1},
		{"postgres://quota@127.0.0.1:5432,127.0.0.1:5433/db?target_session_attrs=read-write", 2},
		{"postgres://quota@h1:1,h2:2,h1:1/db?sslmode=disable", 2},
		{"::not a url", 0},
	} {
		if got := hosts(c.url); got != c.want {
			t.Errorf("hosts(%q) = %d, want %d", c.url, got, c.want)
		}
	}
}
