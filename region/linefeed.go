package region

import (
	"context"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
)

// LineFeed is a sale's waiting line as this leader's room has changed since a version
// (admission.Room.Changes), with why the line admits no one now, if it does not: what a
// storefront edge keeps to answer polls without asking the leader (docs/storefront.md,
// "Edges").
type LineFeed struct {
	admission.Feed
	// Region is this region's name (a ticket names it).
	Region string
	// Gate is GateSoldOut, GatePaused or "": the answer a poll of a queued buyer gets.
	Gate string
	// Tag identifies the feed's incarnation, version, counters and gate: what the next call names to be held
	// while nothing changed.
	Tag uint64
}

// The gates a LineFeed names.
const (
	GateSoldOut = closedSoldOut
	GatePaused  = closedPaused
)

// MaxLineChanges bounds the entries one LineChanges answers.
const MaxLineChanges = 100_000

// LineChanges answers sale's line changed since version since of room incarnation room
// (every entry when room is another: a new leader's), at most limit entries (1 to
// MaxLineChanges). With wait (up to MaxLineWait) it holds the call while the answer would
// bring nothing new, that is while the line's tag is still tag (the caller's last answer's
// LineFeed.Tag), and answers once it is another (seen at the admitting tick) or at the
// wait's end. Only the leader has lines: a standby answers NOT_LEADER.
func (d *Door) LineChanges(ctx context.Context, sale, room string, since uint64, limit int, tag uint64, wait time.Duration) (LineFeed, error) {
	if err := checkIDs("sale_id", sale); err != nil {
		return LineFeed{}, err
	}
	if limit < 1 || limit > MaxLineChanges {
		return LineFeed{}, apierr.Invalid("limit", "must be 1..%d, got %d", MaxLineChanges, limit)
	}
	if wait < 0 || wait > MaxLineWait {
		return LineFeed{}, apierr.Invalid("wait_ms", "must be 0..%d, got %d", MaxLineWait.Milliseconds(), wait.Milliseconds())
	}
	return d.reads.changes(ctx, sale, room, since, limit, tag, wait)
}

// ClosedError is the answer to a poll of a buyer still in a line whose gate is closed
// (LineFeed.Gate): PAUSED or SOLD_OUT, as the leader answers it.
func ClosedError(sale, gate string) error { return closedError(sale, gate) }

// Polls is how many polls of admissions this door has answered (GetAdmission and
// PollAdmission), for the metric quota_line_polls_total.
func (d *Door) Polls() uint64 { return d.reads.polls.Load() }
