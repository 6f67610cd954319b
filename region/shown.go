package region

import (
	"fmt"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
)

// This file is what every adapter (the gRPC server, the HTTP edge, quotactl) tells a client
// the same way, decided once here: the names of hold and admission states, when a queued
// buyer polls again, and the answer of a region without a front door.

// String is the state's name as every client sees it: the HTTP edge's "state", quotactl's
// output, and the word the gRPC adapter's HoldState enum stands for. The constants above are
// the one table of those names (and the stored ones).
func (s HoldState) String() string { return string(s) }

// ErrNoDoor is the answer of a region without a front door (no ticket keys) to the calls of
// one (enter, poll an admission, describe a sale, join a waitlist): CONFLICT.
var ErrNoDoor = fmt.Errorf("this region serves no waiting rooms: %w", apierr.ErrConflict)

// Shown is the admission's state as the buyer is told it: binding reads as queued (a buyer
// not yet told their ticket); every other state as it is. Elsewhere is never an admission but
// the error BOUND_ELSEWHERE (Door.answer).
func (a Admission) Shown() admission.EntryState {
	if a.State == admission.Binding {
		return admission.Queued
	}
	return a.State
}

// RetryAfter is when a queued buyer should poll again: a tenth of the estimated wait, from
// a quarter of a second to five seconds, so polls stay few and a buyer near the front hears
// of their ticket soon; every 2 s on a waitlist (units come back when they do, no estimate);
// 0 for a buyer with an answer.
func (a Admission) RetryAfter() time.Duration {
	if a.State != admission.Queued && a.State != admission.Binding {
		return 0
	}
	if a.SKU != "" {
		return 2 * time.Second
	}
	return time.Duration(min(max(a.EstimatedWait.Milliseconds()/10, 250), 5000)) * time.Millisecond
}
