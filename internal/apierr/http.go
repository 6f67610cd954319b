package apierr

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorBody is the one JSON shape of every error the HTTP edge answers:
// {"error": {"code": "SOLD_OUT", "message": "...", "field": "...", "retry_after_ms": ...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is an error answer's content: Code is the reason of the gRPC answer
// (SOLD_OUT, TICKET_USED, ...), the same word on both APIs.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the bad field of an INVALID_ARGUMENT answer.
	Field string `json:"field,omitempty"`
	// RetryAfterMs is when to ask again, on OVERLOADED and 503 answers (also in Retry-After).
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
	// Region is the region that serves the buyer, on BOUND_ELSEWHERE answers.
	Region string `json:"region,omitempty"`
	// Leader is where the region's leader answers, on NOT_LEADER answers, when known.
	Leader string `json:"leader,omitempty"`
	// SKU is the SKU of the cart's line that was refused, on a cart's refusal (LineError).
	SKU string `json:"sku,omitempty"`
	// Line is that line's index in the request's lines, from 0 (with SKU).
	Line *int `json:"line,omitempty"`
}

// codeHTTP is the HTTP status for a gRPC code whose answer carries no reason of this
// project: the mapping grpc-gateway and connect-go share.
var codeHTTP = map[codes.Code]int{
	codes.OK: 200, codes.Canceled: 499, codes.Unknown: 500, codes.InvalidArgument: 400,
	codes.DeadlineExceeded: 504, codes.NotFound: 404, codes.AlreadyExists: 409,
	codes.PermissionDenied: 403, codes.ResourceExhausted: 429, codes.FailedPrecondition: 400,
	codes.Aborted: 409, codes.OutOfRange: 400, codes.Unimplemented: 501, codes.Internal: 500,
	codes.Unavailable: 503, codes.DataLoss: 500, codes.Unauthenticated: 401,
}

// HTTP turns an error (a domain error, as the region returns it, or a gRPC status error, as
// a peer does) into the HTTP edge's status and body, through the same table as ToStatus, so
// the two APIs never disagree. A domain error is read from the table directly (httpOfDomain);
// a status error from its details. A 503 answer asks to try again after
// UnavailableRetryAfter unless it says when.
func HTTP(err error) (int, ErrorBody) {
	var code int
	var body ErrorBody
	if !isStatus(err) {
		code, body = httpOfDomain(err)
	} else {
		code, body = httpOfStatus(err)
	}
	if code == 503 && body.Error.RetryAfterMs == 0 {
		body.Error.RetryAfterMs = UnavailableRetryAfter.Milliseconds()
	}
	return code, body
}

// UnavailableRetryAfter is when a 503 answer (NOT_LEADER, UNKNOWN_OUTCOME, UNAVAILABLE: a
// leader changing, a database failing over) asks the client to try again, in retry_after_ms
// and Retry-After: a region's leader changes in about 2 s, a database fails over in about
// 11 s, so a client asking every second finds the new one soon without hammering.
const UnavailableRetryAfter = time.Second

// isStatus reports whether status.FromError(err) would find a status in err (nil counts),
// without building one for an error that has none as FromError does.
func isStatus(err error) bool {
	var gs interface{ GRPCStatus() *status.Status }
	return err == nil || errors.As(err, &gs) && gs.GRPCStatus() != nil
}

// httpOfDomain is HTTP of a domain error without building its gRPC status: the table's row
// and the typed errors' fields, as build would attach them. A detail the status could not
// carry (a string that is not UTF-8, which proto refuses) is left out as build leaves it out,
// and with the reason's ErrorInfo gone the answer falls back to the gRPC code's.
func httpOfDomain(err error) (int, ErrorBody) {
	m, _ := match(err)
	d := ErrorDetail{Code: m.reason, Message: err.Error()}
	var nl *NotLeaderError
	if errors.As(err, &nl) && nl.Leader != "" {
		d.Leader = nl.Leader
	}
	var be *BoundError
	if errors.As(err, &be) {
		d.Region, d.Leader = be.Region, ""
	}
	var le *LineError
	if errors.As(err, &le) {
		d.SKU, d.Line = le.SKU, &le.Line
	}
	if !utf8.ValidString(d.Leader) || !utf8.ValidString(d.Region) || !utf8.ValidString(d.SKU) { // no ErrorInfo: no details at all
		d = ErrorDetail{Code: m.code.String(), Message: d.Message}
		if m.code == codes.Internal || m.code == codes.Unknown {
			d.Code = "INTERNAL"
		}
		return codeHTTP[m.code], ErrorBody{Error: d}
	}
	var over *OverloadedError
	var inv *InvalidError
	switch {
	case errors.As(err, &over):
		d.RetryAfterMs = over.RetryAfter.Milliseconds()
	case errors.As(err, &inv) && utf8.ValidString(inv.Field) && utf8.ValidString(inv.Reason):
		d.Field = inv.Field
	}
	return httpOfReason(m.reason, m.http), ErrorBody{Error: d}
}

// httpOfStatus is HTTP of a status error, read from its details.
func httpOfStatus(err error) (int, ErrorBody) {
	st, _ := status.FromError(ToStatus(err))
	d := ErrorDetail{Code: "INTERNAL", Message: st.Message()}
	code, ok := codeHTTP[st.Code()]
	if !ok {
		code = 500
	}
	for _, det := range st.Details() {
		switch v := det.(type) {
		case *errdetails.ErrorInfo:
			if v.GetDomain() != Domain {
				continue
			}
			d.Code = v.GetReason()
			d.Region, d.Leader = v.GetMetadata()["region"], v.GetMetadata()["leader"]
			d.SKU, d.Line = lineOf(v.GetMetadata())
			code = httpOfReason(d.Code, code)
		case *errdetails.RetryInfo:
			d.RetryAfterMs = v.GetRetryDelay().AsDuration().Milliseconds()
		case *errdetails.BadRequest:
			if fv := v.GetFieldViolations(); len(fv) > 0 {
				d.Field = fv[0].GetField()
			}
		}
	}
	if d.Code == "INTERNAL" && st.Code() != codes.Internal && st.Code() != codes.Unknown {
		d.Code = st.Code().String()
	}
	return code, ErrorBody{Error: d}
}

// lineOf reads a refused cart line's SKU and index from an ErrorInfo's metadata.
func lineOf(md map[string]string) (string, *int) {
	sku, ok := md["sku"]
	if !ok {
		return "", nil
	}
	n, err := strconv.Atoi(md["line"])
	if err != nil {
		return sku, nil
	}
	return sku, &n
}

func httpOfReason(reason string, dflt int) int {
	for _, m := range table {
		if m.reason == reason {
			return m.http
		}
	}
	return dflt
}

// HTTPAnswer is an error's whole answer on the HTTP edge, encoded once: the status, the
// Retry-After header's value ("" for none: only answers that ask to try again later carry
// one, in whole seconds rounded up) and the body, the ErrorBody as JSON and a new line.
// Its fields may be shared between answers: read them, never change them.
type HTTPAnswer struct {
	Status     int
	RetryAfter string
	Body       []byte
	// Length is len(Body) in decimal, for Content-Length.
	Length string
}

// AnswerHTTP is HTTP(err) encoded as the edge writes it. The sold-out answers (SOLD_OUT and
// REGION_EXHAUSTED) of domain errors are encoded once per message and shared, as ToStatus
// shares their statuses: once a pool is empty nearly every call of a flash sale gets one of a
// handful of them, and encoding one costs its message and a JSON marshal. Bounded like
// soldOutCache. Their messages name sales, SKUs and counts, never a status error's
// "rpc error: ..." (those are encoded per call).
func AnswerHTTP(err error) *HTTPAnswer {
	m, ok := match(err)
	if !ok || (m.err != ErrSoldOut && m.err != ErrRegionExhausted) {
		return encodeHTTP(err)
	}
	msg := err.Error()
	if a, ok := soldOutHTTP.Load(msg); ok {
		return a.(*HTTPAnswer)
	}
	a := encodeHTTP(err)
	if isStatus(err) {
		return a
	}
	if soldOutHTTP.n.Add(1) > soldOutCacheMax {
		soldOutHTTP.Clear() // racing stores may survive the clear: the bound is loose, not lost
		soldOutHTTP.n.Store(1)
	}
	soldOutHTTP.Store(msg, a)
	return a
}

// soldOutHTTP is AnswerHTTP's cache of the sold-out answers by message.
var soldOutHTTP struct {
	sync.Map
	n atomic.Int64
}

// encodeHTTP is AnswerHTTP without the cache.
func encodeHTTP(err error) *HTTPAnswer {
	code, body := HTTP(err)
	b, merr := json.Marshal(body)
	if merr != nil { // an ErrorBody of strings and a number always marshals
		panic(fmt.Sprintf("apierr: marshal an error body: %v", merr))
	}
	b = append(b, '\n')
	a := &HTTPAnswer{Status: code, Body: b, Length: strconv.Itoa(len(b))}
	if ms := body.Error.RetryAfterMs; ms > 0 {
		a.RetryAfter = strconv.FormatInt((ms+999)/1000, 10)
	}
	return a
}
