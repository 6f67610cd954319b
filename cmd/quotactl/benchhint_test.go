package main

import (
	"strings"
	"testing"

	"github.com/quotaworks/quota/cmd/quotactl/internal/bench"
)

// A run at one concurrency whose (d) missed a target points at the sweep; a met run, or a
// sweep, does not.
func TestPeakHint(t *testing.T) {
	report := func(ns []int, met bool) *bench.Report {
		return &bench.Report{Setup: bench.Setup{Concurrencies: ns},
			Ratios: []bench.Ratio{{Name: "d/e", Met: met}, {Name: "f/e", Met: true}}}
	}
	if got := peakHint(report([]int{64}, false)); !strings.Contains(got, "--concurrency 64,256,1024 --rounds 3") {
		t.Errorf("missed at 64 callers: %q, want the sweep command", got)
	}
	if got := peakHint(report([]int{1024}, false)); !strings.Contains(got, "--concurrency 1024,4096,10000") {
		t.Errorf("missed at 1,024 callers: %q, want the sweep capped at 10,000", got)
	}
	for _, r := range []*bench.Report{report([]int{64}, true), report([]int{64, 1024}, false), report([]int{4096}, false)} {
		if got := peakHint(r); got != "" {
			t.Errorf("%v callers, met %v: %q, want no hint", r.Setup.Concurrencies, r.Ratios[0].Met, got)
		}
	}
}
