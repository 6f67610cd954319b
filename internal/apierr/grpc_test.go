package apierr

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestToStatusTable checks every row of the one error table: wrapped sentinels keep their
// message and get their code and reason; NOT_LEADER carries the leader; invalid input carries
// its field.
func TestToStatusTable(t *testing.T) {
	tests := []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{Invalid("quantity", "must be positive"), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{fmt.Errorf("sale s: %w", ErrSoldOut), codes.FailedPrecondition, "SOLD_OUT"},
		{fmt.Errorf("region us: %w", ErrRegionExhausted), codes.ResourceExhausted, "REGION_EXHAUSTED"},
		{fmt.Errorf("user u: %w", ErrLimitExceeded), codes.ResourceExhausted, "LIMIT_EXCEEDED"},
		{ErrHoldExpired, codes.FailedPrecondition, "HOLD_EXPIRED"},
		{ErrFenced, codes.FailedPrecondition, "FENCED"},
		{&NotLeaderError{Role: "region us", Leader: "127.0.0.1:1"}, codes.Unavailable, "NOT_LEADER"},
		{ErrAlreadyExists, codes.AlreadyExists, "ALREADY_EXISTS"},
		{NotFound("sale", "s"), codes.NotFound, "NOT_FOUND"},
		{ErrNotOpen, codes.FailedPrecondition, "NOT_OPEN"},
		{ErrConflict, codes.FailedPrecondition, "CONFLICT"},
		{ErrUnknownOutcome, codes.Unavailable, "UNKNOWN_OUTCOME"},
		{fmt.Errorf("%w: hold h: %w", ErrAborted, ErrNotFound), codes.Aborted, "ABORTED"}, // the batch's failure wins
		{context.DeadlineExceeded, codes.DeadlineExceeded, "UNKNOWN_OUTCOME"},
		{context.Canceled, codes.Canceled, "CANCELED"},
		{errors.New("disk on fire"), codes.Internal, "INTERNAL"},
	}
	for _, tt := range tests {
		got := ToStatus(tt.err)
		st, _ := status.FromError(got)
		if st.Code() != tt.code || Reason(got) != tt.reason || st.Message() != tt.err.Error() {
			t.Errorf("ToStatus(%v) = %v %q %q, want %v %q %q", tt.err, st.Code(), Reason(got), st.Message(), tt.code, tt.reason, tt.err.Error())
		}
	}
	if h := LeaderHint(ToStatus(&NotLeaderError{Role: "r", Leader: "127.0.0.1:1"})); h != "127.0.0.1:1" {
		t.Errorf("leader hint %q", h)
	}
	if f := Field(ToStatus(Invalid("quantity", "must be positive"))); f != "quantity" {
		t.Errorf("field %q", f)
	}
	if ToStatus(nil) != nil {
		t.Error("ToStatus(nil) is not nil")
	}
}

// TestSoldOutStatusesAreShared checks the cache of the sold-out answers: one message gives one
// shared status, another message its own, other errors are built per call, and the cache
// starts over at its bound, answering right throughout.
func TestSoldOutStatusesAreShared(t *testing.T) {
	a := fmt.Errorf("region us: 0 of sku-a left, 1 asked: %w", ErrRegionExhausted)
	if ToStatus(a) != ToStatus(fmt.Errorf("region us: 0 of sku-a left, 1 asked: %w", ErrRegionExhausted)) {
		t.Error("the same REGION_EXHAUSTED message built two statuses")
	}
	b := fmt.Errorf("sale s: sku-a is sold out in every region: %w", ErrSoldOut)
	if ToStatus(a) == ToStatus(b) || Reason(ToStatus(b)) != "SOLD_OUT" {
		t.Error("two different sold-out answers share a status")
	}
	limit := fmt.Errorf("user u: %w", ErrLimitExceeded)
	if ToStatus(limit) == ToStatus(limit) {
		t.Error("a LIMIT_EXCEEDED status was cached")
	}
	for i := 0; i < soldOutCacheMax+10; i++ {
		err := fmt.Errorf("region us: 0 of sku-%d left, 1 asked: %w", i, ErrRegionExhausted)
		st, _ := status.FromError(ToStatus(err))
		if st.Message() != err.Error() || st.Code() != codes.ResourceExhausted {
			t.Fatalf("answer %d: %v", i, st)
		}
	}
	n := 0
	soldOutCache.Range(func(any, any) bool { n++; return true })
	if n > soldOutCacheMax || n == 0 {
		t.Errorf("cache holds %d entries, bound %d; want it started over and caching again", n, soldOutCacheMax)
	}
	last := fmt.Errorf("region us: 0 of sku-%d left, 1 asked: %w", soldOutCacheMax+9, ErrRegionExhausted)
	if ToStatus(last) != ToStatus(last) {
		t.Error("past the bound, answers are no longer shared")
	}
}

// TestReasonOf: the reason of a domain error is the one ToStatus gives it, for every row of
// the table and for an error of no row; Reasons lists each exactly once.
func TestReasonOf(t *testing.T) {
	if got := ReasonOf(nil); got != "" {
		t.Errorf("ReasonOf(nil) = %q", got)
	}
	all := Reasons()
	for _, m := range table {
		err := fmt.Errorf("context: %w", m.err)
		if got, want := ReasonOf(err), Reason(ToStatus(err)); got != want {
			t.Errorf("ReasonOf(%v) = %q; ToStatus says %q", err, got, want)
		}
		if got := ReasonOf(ToStatus(err)); got != m.reason {
			t.Errorf("ReasonOf(status of %v) = %q; want %q", err, got, m.reason)
		}
	}
	if got := ReasonOf(errors.New("disk on fire")); got != "INTERNAL" {
		t.Errorf("an error of no sentinel: %q; want INTERNAL", got)
	}
	seen := map[string]bool{}
	for _, r := range all {
		if seen[r] {
			t.Errorf("Reasons lists %s twice", r)
		}
		seen[r] = true
	}
	if !seen["INTERNAL"] || !seen["SOLD_OUT"] || !seen["REGION_EXHAUSTED"] {
		t.Errorf("Reasons %v misses a reason", all)
	}
}

// TestLineSKU: a cart's refusal names the refused line's SKU over gRPC, wrapped or not; an
// error of no line names none.
func TestLineSKU(t *testing.T) {
	refused := ToStatus(fmt.Errorf("reserve cart: %w", &LineError{Line: 1, SKU: "case", Err: ErrSoldOut}))
	if got := LineSKU(refused); got != "case" || Reason(refused) != "SOLD_OUT" {
		t.Errorf("LineSKU of a refused line: %q (%s), want case (SOLD_OUT)", got, Reason(refused))
	}
	for _, err := range []error{ToStatus(ErrSoldOut), errors.New("plain"), nil} {
		if got := LineSKU(err); got != "" {
			t.Errorf("LineSKU(%v) = %q, want none", err, got)
		}
	}
}

// TestAskAnother: only NOT_LEADER and an answer that never came (UNAVAILABLE without a
// reason) send a caller to another process; a decided refusal, OVERLOADED's UNAVAILABLE
// included, does not.
func TestAskAnother(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"none", nil, false},
		{"not leader", ToStatus(&NotLeaderError{Role: "r", Leader: "127.0.0.1:1"}), true},
		{"no answer", status.Error(codes.Unavailable, "connection refused"), true},
		{"overloaded", ToStatus(&OverloadedError{What: "queue", RetryAfter: time.Second}), false},
		{"sold out", ToStatus(ErrSoldOut), false},
		{"deadline", status.Error(codes.DeadlineExceeded, "late"), false},
		{"not a status", errors.New("plain"), false},
	} {
		if got := AskAnother(tc.err); got != tc.want {
			t.Errorf("%s: AskAnother = %v, want %v (%v)", tc.name, got, tc.want, tc.err)
		}
	}
}
