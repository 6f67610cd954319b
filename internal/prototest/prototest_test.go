package prototest_test

import (
	"slices"
	"testing"

	"github.com/quotaworks/quota/internal/prototest"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestUnset finds every zero field, at the top and inside lists and nested messages, and
// nothing once each is set; skip leaves a field out wherever it is.
func TestUnset(t *testing.T) {
	s := &quotav1.Sale{SaleId: "s", Skus: []*quotav1.SkuLedger{{Sku: "a", Total: 1}}, OpensAt: &timestamppb.Timestamp{}}
	got := prototest.Unset(s)
	for _, want := range []string{"per_user_limit", "created_at", "pauses", "skus[0].unallocated", "skus[0].allocated", "opens_at.seconds"} {
		if !slices.Contains(got, want) {
			t.Errorf("Unset(%v) = %v: misses %s", s, got, want)
		}
	}
	if slices.Contains(got, "sale_id") || slices.Contains(got, "skus[0].sku") {
		t.Errorf("Unset(%v) = %v: lists a set field", s, got)
	}
	if got := prototest.Unset(s, "unallocated", "per_user_limit"); slices.Contains(got, "skus[0].unallocated") || slices.Contains(got, "per_user_limit") {
		t.Errorf("skipped fields listed: %v", got)
	}
	full := &quotav1.Violation{Invariant: "I1", SaleId: "s", Sku: "k", Region: "us", Detail: "d"}
	if got := prototest.Unset(full); len(got) != 0 {
		t.Errorf("Unset of a full message = %v", got)
	}
	if got := prototest.Unset(nil); !slices.Equal(got, []string{""}) {
		t.Errorf("Unset(nil) = %v", got)
	}
}
