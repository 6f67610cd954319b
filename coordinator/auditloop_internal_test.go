package coordinator

import "testing"

// TestOnlyAProvenBreachPauses: the continuous audit pauses a SKU on its I1 sum alone; an
// unreadable region (conservation unproven), views that never agreed (no SKU), and the other
// invariants pause nothing.
func TestOnlyAProvenBreachPauses(t *testing.T) {
	for _, tt := range []struct {
		v    Violation
		want bool
	}{
		{Violation{Invariant: "I1", Sale: "s", SKU: "phone", Detail: "total 100 != ... = 101"}, true},
		{Violation{Invariant: "I1", Sale: "s", SKU: "phone", Region: "us", Detail: "region us could not be read, conservation unproven"}, false},
		{Violation{Invariant: "I1", Sale: "s", Detail: "region records and the ledger disagreed in 8 reads"}, false},
		{Violation{Invariant: "I3", Sale: "s", SKU: "phone", Region: "us"}, false},
		{Violation{Invariant: "I5", Sale: "s", SKU: "phone", Region: "eu"}, false},
	} {
		if got := breach(tt.v); got != tt.want {
			t.Errorf("breach(%+v) = %v, want %v", tt.v, got, tt.want)
		}
	}
}
