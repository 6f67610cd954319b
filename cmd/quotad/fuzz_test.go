package main

import (
	"strings"
	"testing"
)

// FuzzParseRegions: `--region name=addr=db-url` specs either parse into endpoints with a
// valid name and non-empty address and URL, or are refused with the spec in the message.
func FuzzParseRegions(f *testing.F) {
	for _, s := range []string{"us=127.0.0.1:7401=postgres://q:q@h/db", "us==x", "=a=b", "US=a=b", "us=a", "us=a=b=c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		eps, err := parseRegions([]string{spec})
		if err != nil {
			if !strings.Contains(err.Error(), "region") {
				t.Fatalf("error without context: %v", err)
			}
			return
		}
		if len(eps) != 1 || eps[0].Name == "" || eps[0].Addr == "" || eps[0].DBURL == "" {
			t.Fatalf("accepted %q as %+v", spec, eps)
		}
	})
}
