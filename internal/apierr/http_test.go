package apierr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// answerCases are errors of every kind the edge answers: each row of the table, the typed
// errors with their extra fields, status errors (local and a peer's) and an unknown error.
func answerCases() []error {
	return []error{
		Invalid("quantity", "must be positive"),
		fmt.Errorf("sale s: sku-a is sold out in every region: %w", ErrSoldOut),
		fmt.Errorf("region us: 0 of sku-a left, 1 asked: %w", ErrRegionExhausted),
		fmt.Errorf("user u: %w", ErrLimitExceeded),
		ErrHoldExpired, ErrFenced, ErrAlreadyExists, ErrNotOpen, ErrConflict, ErrUnknownOutcome,
		&NotLeaderError{Role: "region us", Leader: "127.0.0.1:1"},
		&NotLeaderError{Role: "region us"},
		NotFound("sale", "s"),
		fmt.Errorf("%w: hold h: %w", ErrAborted, ErrSoldOut),
		fmt.Errorf("ticket: %w", ErrTicketInvalid),
		&OverloadedError{What: "the waiting room", RetryAfter: 1500 * time.Millisecond},
		&OverloadedError{What: "the queue", RetryAfter: 3 * time.Millisecond},
		&BoundError{Sale: "s", Region: "eu"},
		context.DeadlineExceeded, context.Canceled,
		errors.New("disk on fire"),
		status.Error(codes.Unavailable, "peer down"),
		FromStatus(ToStatus(fmt.Errorf("sale s: sku-b is sold out in every region: %w", ErrSoldOut))),
		fmt.Errorf("reserve: %w", FromStatus(ToStatus(fmt.Errorf("region eu: 0 of x left, 1 asked: %w", ErrRegionExhausted)))),
	}
}

// TestAnswerHTTPIsHTTPEncoded checks that every encoded answer is HTTP's status and body,
// marshalled with a new line, with Retry-After (whole seconds, rounded up) exactly when the
// body carries retry_after_ms, asked twice (the second answer of a sold-out error from the
// cache).
func TestAnswerHTTPIsHTTPEncoded(t *testing.T) {
	for _, err := range answerCases() {
		code, body := HTTP(err)
		want, merr := json.Marshal(body)
		if merr != nil {
			t.Fatal(merr)
		}
		want = append(want, '\n')
		wantRetry := ""
		if body.Error.RetryAfterMs > 0 {
			wantRetry = strconv.FormatInt((body.Error.RetryAfterMs+999)/1000, 10)
		}
		for i := range 2 {
			a := AnswerHTTP(err)
			if a.Status != code || !bytes.Equal(a.Body, want) || a.Length != strconv.Itoa(len(want)) || a.RetryAfter != wantRetry {
				t.Errorf("%v (call %d): %d %q len %s retry %q; want %d %q len %d retry %q",
					err, i, a.Status, a.Body, a.Length, a.RetryAfter, code, want, len(want), wantRetry)
			}
		}
	}
	if a := AnswerHTTP(&OverloadedError{What: "q", RetryAfter: 1500 * time.Millisecond}); a.RetryAfter != "2" || a.Status != 429 {
		t.Errorf("overloaded for 1.5 s: %d Retry-After %q; want 429 and 2", a.Status, a.RetryAfter)
	}
	if a := AnswerHTTP(fmt.Errorf("sale s: a is sold out in every region: %w", ErrSoldOut)); a.Status != 409 ||
		string(a.Body) != `{"error":{"code":"SOLD_OUT","message":"sale s: a is sold out in every region: sold out"}}`+"\n" {
		t.Errorf("sold out: %d %s", a.Status, a.Body)
	}
}

// TestSoldOutAnswersAreShared checks AnswerHTTP's cache: one sold-out message is one shared
// answer, another message its own; other refusals and status errors are encoded per call;
// past its bound it starts over, answering right throughout.
func TestSoldOutAnswersAreShared(t *testing.T) {
	a := fmt.Errorf("region us: 0 of sku-q left, 1 asked: %w", ErrRegionExhausted)
	if AnswerHTTP(a) != AnswerHTTP(fmt.Errorf("region us: 0 of sku-q left, 1 asked: %w", ErrRegionExhausted)) {
		t.Error("the same REGION_EXHAUSTED message encoded twice")
	}
	b := fmt.Errorf("sale s: sku-q is sold out in every region: %w", ErrSoldOut)
	if AnswerHTTP(a) == AnswerHTTP(b) {
		t.Error("two different sold-out answers share one encoding")
	}
	for _, err := range []error{
		fmt.Errorf("user u: %w", ErrLimitExceeded),
		FromStatus(ToStatus(fmt.Errorf("sale s: sku-r is sold out in every region: %w", ErrSoldOut))),
	} {
		if AnswerHTTP(err) == AnswerHTTP(err) {
			t.Errorf("%v: encoded once and shared", err)
		}
	}
	for i := 0; i < soldOutCacheMax+10; i++ {
		err := fmt.Errorf("region us: 0 of sku-%d left, 1 asked: %w", i, ErrRegionExhausted)
		want := fmt.Sprintf(`{"error":{"code":"REGION_EXHAUSTED","message":%q}}`+"\n", err.Error())
		if a := AnswerHTTP(err); a.Status != 409 || string(a.Body) != want {
			t.Fatalf("answer %d: %d %s", i, a.Status, a.Body)
		}
	}
	n := 0
	soldOutHTTP.Range(func(any, any) bool { n++; return true })
	if n > soldOutCacheMax {
		t.Errorf("the cache holds %d answers, over its bound %d", n, soldOutCacheMax)
	}
}

// TestSoldOutAnswerAllocs pins the cost of a sold-out answer once encoded: no allocation
// (the edge answers it to every buyer of a sold-out SKU).
func TestSoldOutAnswerAllocs(t *testing.T) {
	err := fmt.Errorf("sale s: sku-z is sold out in every region: %w", ErrSoldOut)
	AnswerHTTP(err)
	if n := testing.AllocsPerRun(200, func() { AnswerHTTP(err) }); n != 0 {
		t.Errorf("a sold-out answer allocates %v times; want 0", n)
	}
}

// TestHTTPOfDomainIsHTTPOfStatus: a domain error read from the table directly answers what
// its gRPC status answers (the status and every field of the body), for every kind of error
// the edge answers and for the strings a status cannot carry (not UTF-8), so the HTTP edge
// and the gRPC API never disagree.
func TestHTTPOfDomainIsHTTPOfStatus(t *testing.T) {
	cases := append(answerCases(),
		Invalid("sku\xff", "bad"), Invalid("sku", "bad \xff byte"),
		&BoundError{Sale: "s", Region: "e\xffu"}, &NotLeaderError{Role: "r", Leader: "\xff"},
		fmt.Errorf("%w and %w", &OverloadedError{What: "q", RetryAfter: time.Second}, Invalid("f", "r")),
		fmt.Errorf("%w and %w", Invalid("f", "r"), &BoundError{Sale: "s", Region: "eu"}),
		fmt.Errorf("%w, %w", &NotLeaderError{Role: "r", Leader: "h:1"}, &BoundError{Sale: "s", Region: "eu"}),
		fmt.Errorf("wrapped: %w", &OverloadedError{What: "q", RetryAfter: -time.Second}),
		errors.New("message \xff not UTF-8"), fmt.Errorf("deadline: %w", context.DeadlineExceeded),
	)
	for _, err := range cases {
		code, body := HTTP(err)
		wantCode, want := HTTP(ToStatus(err)) // the status path: httpOfStatus, then the same 503 default
		if code != wantCode || body != want {
			t.Errorf("%q: %d %+v; its status answers %d %+v", err, code, body, wantCode, want)
		}
		if _, st := status.FromError(err); isStatus(err) != st {
			t.Errorf("%q: isStatus %v, status.FromError %v", err, !st, st)
		}
	}
}

// TestHTTPOfDomainBuildsNoStatus pins the cost of a domain error's answer: read from the
// table (8 allocations for a bad field: its message and the typed errors looked for), not
// built as a gRPC status with details and read back (39 that way).
func TestHTTPOfDomainBuildsNoStatus(t *testing.T) {
	err := Invalid("quantity", "must be positive")
	if n := testing.AllocsPerRun(100, func() { HTTP(err) }); n > 10 {
		t.Errorf("the answer to a bad field allocates %v times; want at most 10", n)
	}
}

// TestUnavailableAnswersAskToRetry: every 503 answer (a leader changing, an unknown outcome,
// a peer unavailable) carries retry_after_ms and Retry-After of UnavailableRetryAfter, and no
// other answer but OVERLOADED carries either.
func TestUnavailableAnswersAskToRetry(t *testing.T) {
	for _, err := range answerCases() {
		a := AnswerHTTP(err)
		_, body := HTTP(err)
		var over *OverloadedError
		switch {
		case a.Status == 503:
			if body.Error.RetryAfterMs != UnavailableRetryAfter.Milliseconds() || a.RetryAfter != "1" {
				t.Errorf("%v: 503 with retry_after_ms %d, Retry-After %q; want %d and 1", err, body.Error.RetryAfterMs, a.RetryAfter, UnavailableRetryAfter.Milliseconds())
			}
		case errors.As(err, &over):
		case body.Error.RetryAfterMs != 0 || a.RetryAfter != "":
			t.Errorf("%v: %d with retry_after_ms %d, Retry-After %q; want neither", err, a.Status, body.Error.RetryAfterMs, a.RetryAfter)
		}
	}
}
