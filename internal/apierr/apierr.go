// Package apierr holds the outcomes every API shares (sold out, fenced, not leader, ...) and
// the one table that maps them to gRPC status codes with a machine-readable reason.
package apierr

import (
	"errors"
	"fmt"
	"time"
)

// Sentinels for the expected outcomes every API shares (docs/cli.md and docs/storefront.md list them). Packages re-export the ones they
// return; callers test them with errors.Is.
var (
	// ErrSoldOut: the SKU is gone in every region; final.
	ErrSoldOut = errors.New("sold out")
	// ErrRegionExhausted: this region's pool is empty but stock may remain elsewhere.
	ErrRegionExhausted = errors.New("region exhausted")
	// ErrLimitExceeded: the user's per-user limit would be passed.
	ErrLimitExceeded = errors.New("per-user limit exceeded")
	// ErrHoldExpired: the hold is no longer live (expired or released).
	ErrHoldExpired = errors.New("hold expired")
	// ErrFenced: the request carries a generation or epoch below one already seen (I4).
	ErrFenced = errors.New("fenced: stale generation")
	// ErrNotLeader: this process does not lead its role right now.
	ErrNotLeader = errors.New("not leader")
	// ErrAlreadyExists: an idempotency key was reused with a different request.
	ErrAlreadyExists = errors.New("already exists with different content")
	// ErrNotFound: the named sale, SKU, hold or region does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNotOpen: the sale has not opened yet.
	ErrNotOpen = errors.New("sale not open")
	// ErrConflict: the request is well formed but the state does not allow it.
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the request is malformed; InvalidError carries the field.
	ErrInvalid = errors.New("invalid argument")
	// ErrUnknownOutcome: the change may or may not have committed (a commit whose reply was
	// lost). It is never a failure: the caller asks again with the same idempotency key or id.
	ErrUnknownOutcome = errors.New("outcome unknown: ask again with the same key")
	// ErrAborted: the request was not carried out because something else failed with it
	// (the region's batch it was decided in did not commit, surely; the buyer's binding could
	// not be written); nothing changed, and asking again with the same key or id is safe.
	ErrAborted = errors.New("not carried out, nothing changed: ask again")
	// ErrUnauthenticated: the call came without a client certificate the cluster trusts.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the caller's role may not make this call (trust.Methods).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrOverloaded: a bounded queue or table is full; nothing changed, and the caller may
	// try again after the retry-after it is given.
	ErrOverloaded = errors.New("overloaded")
	// ErrTooManyKeys: a buyer has used as many request keys in a sale as a region keeps.
	ErrTooManyKeys = errors.New("too many request keys")
	// ErrPaused: the sale or SKU is paused (the kill switch); no new holds are made.
	ErrPaused = errors.New("paused")
	// ErrTicketInvalid: an admission ticket is badly signed, expired, or for another sale,
	// user or region.
	ErrTicketInvalid = errors.New("ticket invalid")
	// ErrTicketUsed: the admission ticket already backs a reservation with another request key.
	ErrTicketUsed = errors.New("ticket used")
	// ErrBoundElsewhere: the buyer is bound to another region for this sale (at their
	// admission, or their first reservation in a sale without a waiting room), which alone
	// serves them (the global per-user limit); BoundError names it.
	ErrBoundElsewhere = errors.New("buyer bound to another region")
)

// InvalidError names the field of a bad request and why it is bad.
type InvalidError struct {
	Field  string
	Reason string
}

// Error names the field and the reason.
func (e *InvalidError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// Invalid builds an InvalidError for field.
func Invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// OverloadedError is ErrOverloaded with what is full and when to try again.
type OverloadedError struct {
	What       string
	RetryAfter time.Duration
}

// Error says what is full and when to try again.
func (e *OverloadedError) Error() string {
	return fmt.Sprintf("%s is full: try again in %s", e.What, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrOverloaded) hold.
func (e *OverloadedError) Unwrap() error { return ErrOverloaded }

// NotLeaderError is ErrNotLeader with where the leader is, when known, so a client can go
// there instead of guessing.
type NotLeaderError struct {
	Role   string
	Leader string
}

// Error says who is not leader and, when known, where the leader is.
func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return fmt.Sprintf("%s: not leader (no leader known)", e.Role)
	}
	return fmt.Sprintf("%s: not leader; the leader is at %s", e.Role, e.Leader)
}

// Unwrap makes errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// NotFound wraps ErrNotFound with what was missing.
func NotFound(field, value string) error {
	return fmt.Errorf("%s %q: %w", field, value, ErrNotFound)
}

// BoundError is ErrBoundElsewhere with the region the buyer is bound to, so a storefront can
// send the buyer there.
type BoundError struct {
	Sale   string
	Region string
}

// Error names the sale and the region that serves the buyer.
func (e *BoundError) Error() string {
	return fmt.Sprintf("sale %s: this buyer is bound to region %s, which alone serves them", e.Sale, e.Region)
}

// Unwrap makes errors.Is(err, ErrBoundElsewhere) hold.
func (e *BoundError) Unwrap() error { return ErrBoundElsewhere }

// LineError is a cart's line refused: which line (from 0), its SKU, and why (Err, a sentinel
// of the table, which decides the answer's code). The HTTP answer names the SKU (sku) and the
// line (line); the gRPC answer carries both in its ErrorInfo's metadata.
type LineError struct {
	Line int
	SKU  string
	Err  error
}

// Error names the line, its SKU and the reason.
func (e *LineError) Error() string {
	return fmt.Sprintf("lines[%d] (sku %s): %v", e.Line, e.SKU, e.Err)
}

// Unwrap makes errors.Is see the line's reason.
func (e *LineError) Unwrap() error { return e.Err }
