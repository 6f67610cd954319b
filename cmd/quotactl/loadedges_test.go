package main

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestParseEdgesSeveralPerRegion: --http names a region once per edge; its URLs are kept in
// order, the same URL twice and a region past its bound are refused, naming the flag.
func TestParseEdgesSeveralPerRegion(t *testing.T) {
	got, err := parseEdges("us=https://127.0.0.1:8601,eu=https://127.0.0.1:8609/,us=https://127.0.0.1:8602", false)
	want := map[string][]string{"us": {"https://127.0.0.1:8601", "https://127.0.0.1:8602"}, "eu": {"https://127.0.0.1:8609"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("parseEdges: %v %v; want %v", got, err, want)
	}
	if _, err := parseEdges("us=https://a:1,us=https://a:1/", false); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("the same URL twice: %v; want given twice", err)
	}
	many := make([]string, maxEdgesPerRegion+1)
	for i := range many {
		many[i] = "us=https://127.0.0.1:" + strconv.Itoa(8601+i)
	}
	if _, err := parseEdges(strings.Join(many, ","), false); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("%d URLs for us: %v; want refused", len(many), err)
	}
}
