package main

import (
	"strings"
	"testing"
)

// TestPlanRefusesTheOtherPlannersFlags: rebalance --plan shows the automatic rebalancer,
// which has its own settings; a flag of the command's own planner (--dry-run, --window, ...)
// typed with it would be ignored, so it is a usage error naming the flag, made before any
// call. The same setting from a QUOTA_* variable (one environment for every command) is not.
func TestPlanRefusesTheOtherPlannersFlags(t *testing.T) {
	base := []string{"--coordinator", "127.0.0.1:1", "--timeout", "2s", "rebalance", "--sale", "s", "--plan"}
	for _, extra := range [][]string{{"--dry-run"}, {"--window", "5m"}, {"--horizon", "5m"}, {"--min-units", "3"},
		{"--request-key", "rb-1"}, {"--request-id", "rb-1"}} {
		_, err := run(t, append(base, extra...)...)
		name := strings.TrimPrefix(extra[0], "--")
		if name == "request-id" {
			name = "request-key"
		}
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "--"+name+" with --plan") || !strings.Contains(err.Error(), "automatic rebalancer") {
			t.Errorf("rebalance --plan %v: exit %d (%v); want 2 naming --%s and saying --plan is the automatic rebalancer's", extra, exitCode(err), err, name)
		}
	}
	t.Setenv("QUOTA_WINDOW", "5m")
	if _, err := run(t, base...); exitCode(err) != 1 || strings.Contains(err.Error(), "with --plan") {
		t.Errorf("rebalance --plan with QUOTA_WINDOW set: exit %d (%v); want it to go on to the call (and fail: no coordinator)", exitCode(err), err)
	}
}
