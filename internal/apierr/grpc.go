package apierr

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every reason this project sets.
const Domain = "quota.v1"

type mapping struct {
	err    error
	code   codes.Code
	reason string
	// http is the HTTP status of the edge's answer: the mapping grpc-gateway and connect-go
	// share for code, but for the outcomes of a sale's state a storefront acts on (sold out,
	// exhausted, over the limit, a used ticket, not open, paused, bound elsewhere), which are
	// 409 Conflict: the request was fine, the sale's state refuses it.
	http int
}

// table is the single map from outcome to gRPC code, reason and HTTP status (docs/cli.md, "Errors").
// Order matters only for errors wrapping several sentinels; the first match wins.
var table = []mapping{
	{ErrInvalid, codes.InvalidArgument, "INVALID_ARGUMENT", 400},
	{ErrAborted, codes.Aborted, "ABORTED", 409}, // before the sentinels a batch's failure may wrap
	{ErrSoldOut, codes.FailedPrecondition, "SOLD_OUT", 409},
	{ErrRegionExhausted, codes.ResourceExhausted, "REGION_EXHAUSTED", 409},
	{ErrLimitExceeded, codes.ResourceExhausted, "LIMIT_EXCEEDED", 409},
	{ErrHoldExpired, codes.FailedPrecondition, "HOLD_EXPIRED", 409},
	{ErrFenced, codes.FailedPrecondition, "FENCED", 409},
	{ErrNotLeader, codes.Unavailable, "NOT_LEADER", 503},
	{ErrTicketUsed, codes.AlreadyExists, "TICKET_USED", 409}, // before ErrAlreadyExists
	{ErrAlreadyExists, codes.AlreadyExists, "ALREADY_EXISTS", 409},
	{ErrNotFound, codes.NotFound, "NOT_FOUND", 404},
	{ErrNotOpen, codes.FailedPrecondition, "NOT_OPEN", 409},
	{ErrConflict, codes.FailedPrecondition, "CONFLICT", 409},
	{ErrUnknownOutcome, codes.Unavailable, "UNKNOWN_OUTCOME", 503},
	{ErrUnauthenticated, codes.Unauthenticated, "UNAUTHENTICATED", 401},
	{ErrTicketInvalid, codes.Unauthenticated, "TICKET_INVALID", 401},
	{ErrPermissionDenied, codes.PermissionDenied, "PERMISSION_DENIED", 403},
	{ErrOverloaded, codes.ResourceExhausted, "OVERLOADED", 429},
	{ErrTooManyKeys, codes.ResourceExhausted, "TOO_MANY_KEYS", 429},
	{ErrPaused, codes.FailedPrecondition, "PAUSED", 409},
	{ErrBoundElsewhere, codes.FailedPrecondition, "BOUND_ELSEWHERE", 409},
	{context.DeadlineExceeded, codes.DeadlineExceeded, "UNKNOWN_OUTCOME", 503}, // the reason's status, as above
	{context.Canceled, codes.Canceled, "CANCELED", 499},
}

// ToStatus turns an error from the domain packages into a gRPC status error with an
// ErrorInfo reason (and a BadRequest field violation for invalid input). Errors that match
// no sentinel become Internal: they are bugs or infrastructure failures, reported as such.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	m, _ := match(err)
	if m.err != ErrRegionExhausted && m.err != ErrSoldOut {
		return build(err, m)
	}
	return soldOutStatus(err, m)
}

// match is the table's first row whose sentinel err wraps; ok false (and the INTERNAL
// mapping) when none does.
func match(err error) (m mapping, ok bool) {
	for _, t := range table {
		if errors.Is(err, t.err) {
			return t, true
		}
	}
	return mapping{code: codes.Internal, reason: "INTERNAL", http: 500}, false
}

// ReasonOf is the reason ToStatus would give a domain error ("SOLD_OUT", ...; "INTERNAL"
// when it matches no sentinel), without building the status: "" for nil. The metrics count
// outcomes by it, so a label takes only the table's words.
func ReasonOf(err error) string {
	if err == nil {
		return ""
	}
	for _, t := range table {
		if errors.Is(err, t.err) {
			return t.reason
		}
	}
	if r := Reason(err); r != "" && slices.ContainsFunc(table, func(m mapping) bool { return m.reason == r }) {
		return r // a status error from a peer
	}
	return "INTERNAL"
}

// Reasons is every reason ReasonOf can return, each once, in the table's order.
func Reasons() []string {
	var out []string
	for _, t := range table {
		if !slices.Contains(out, t.reason) {
			out = append(out, t.reason)
		}
	}
	return append(out, "INTERNAL")
}

// soldOutCache holds the finished status errors of the two sold-out answers by message. Once
// a pool is empty, nearly every call of a flash sale gets one of a handful of them, and
// building one costs a proto marshal of its details each time. The answers carry only a
// message, a code and a reason, so one value serves every call. Bounded, since messages name
// sales, SKUs and counts: it starts over empty once it holds soldOutCacheMax entries.
var soldOutCache struct {
	sync.Map
	n atomic.Int64
}

const soldOutCacheMax = 4096

func soldOutStatus(err error, m mapping) error {
	msg := err.Error()
	if st, ok := soldOutCache.Load(msg); ok {
		return st.(error)
	}
	st := build(err, m)
	if soldOutCache.n.Add(1) > soldOutCacheMax {
		soldOutCache.Clear() // racing stores may survive the clear: the bound is loose, not lost
		soldOutCache.n.Store(1)
	}
	soldOutCache.Store(msg, st)
	return st
}

func build(err error, m mapping) error {
	st := status.New(m.code, err.Error())
	info := &errdetails.ErrorInfo{Reason: m.reason, Domain: Domain}
	var nl *NotLeaderError
	if errors.As(err, &nl) && nl.Leader != "" {
		info.Metadata = map[string]string{"leader": nl.Leader}
	}
	var be *BoundError
	if errors.As(err, &be) {
		info.Metadata = map[string]string{"region": be.Region}
	}
	var le *LineError
	if errors.As(err, &le) {
		info.Metadata = map[string]string{"sku": le.SKU, "line": strconv.Itoa(le.Line)}
	}
	var over *OverloadedError
	if errors.As(err, &over) {
		if withD, derr := st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(over.RetryAfter)}); derr == nil {
			return withD.Err()
		}
	}
	var inv *InvalidError
	if errors.As(err, &inv) {
		bad := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: inv.Field, Description: inv.Reason},
		}}
		if withD, derr := st.WithDetails(info, bad); derr == nil {
			return withD.Err()
		}
	}
	if withD, derr := st.WithDetails(info); derr == nil {
		return withD.Err()
	}
	return st.Err()
}

// Reason returns the machine-readable reason of a status error ("SOLD_OUT", ...), or ""
// when the error carries none.
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// AskAnother reports whether err, a call's answer from one of a role's processes, means
// another process should be asked: NOT_LEADER (nothing was decided), or no answer at all (a
// transport failure: UNAVAILABLE with no reason of the project's).
func AskAnother(err error) bool {
	if err == nil {
		return false
	}
	if Reason(err) == "NOT_LEADER" {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && Reason(err) == ""
}

// LeaderHint returns the leader's address carried by a NOT_LEADER status error, or "".
func LeaderHint(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetMetadata()["leader"]
		}
	}
	return ""
}

// LineSKU returns the SKU of the cart line a refusal of a cart names (a LineError's, carried
// in the ErrorInfo's metadata), or "".
func LineSKU(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetMetadata()["sku"]
		}
	}
	return ""
}

// RetryAfter returns the delay an OVERLOADED status error asks for, or 0.
func RetryAfter(err error) time.Duration {
	st, ok := status.FromError(err)
	if !ok {
		return 0
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// Field returns the field named by an InvalidArgument status error, or "".
func Field(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// FromStatus turns a status error received from a peer back into the domain sentinel
// (wrapped with the peer's message), so callers use errors.Is on both sides of the wire.
// Errors without a known reason are returned unchanged.
func FromStatus(err error) error {
	reason := Reason(err)
	if reason == "" {
		return err
	}
	for _, m := range table {
		if m.reason == reason {
			return &remoteError{sentinel: m.err, err: err}
		}
	}
	return err
}

type remoteError struct {
	sentinel error
	err      error
}

// Error is the peer's message.
func (e *remoteError) Error() string { return e.err.Error() }

// Unwrap gives both the sentinel (for errors.Is) and the status error.
func (e *remoteError) Unwrap() []error { return []error{e.sentinel, e.err} }
