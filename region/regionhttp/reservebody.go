package regionhttp

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
)

// reserveBody is the body of POST /v1/sales/{sale}/reservations.
type reserveBody struct {
	Ticket     string `json:"ticket"`
	User       string `json:"user_id"` // only in a sale without a waiting room; else the ticket's
	SKU        string `json:"sku"`
	Quantity   int64  `json:"quantity"`
	RequestKey string `json:"request_key"`
	// Lines, in place of SKU and Quantity, reserve a cart (cart.go). A body with lines is
	// decoded by decode (plainReserve knows no "lines").
	Lines []cartLineJSON `json:"lines"`
}

// cartLineJSON is one line of a cart's reserve body.
type cartLineJSON struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// reserveFields are reserveBody's JSON names, in the order of the bits of plainReserve's
// seen.
var reserveFields = [...]string{"ticket", "user_id", "sku", "quantity", "request_key"}

// peekSize is how much of a reserve's body decodeReserve reads before it decides how to
// decode it; a storefront's body is a few hundred bytes.
const peekSize = 2048

// peekBuffers are decodeReserve's buffers.
var peekBuffers = sync.Pool{New: func() any { return new([peekSize]byte) }}

// decodeReserve reads a reserve's body into v with decode's answers, errors included. Every
// reserve decodes its body, sold-out answers too, so the common body is read without
// reflection: one JSON object of reserveFields, each at most once and spelled as they are,
// its strings printable ASCII without escapes, the quantity a whole number of at most 18
// digits, and nothing after it but white space, all within peekSize bytes. Any other body
// (escapes, other keys or spellings, null, a value of another type, anything after the
// object, a longer body) is decoded by decode from the same bytes, as it always was.
func decodeReserve(r *http.Request, v *reserveBody) error {
	buf := peekBuffers.Get().(*[peekSize]byte)
	defer peekBuffers.Put(buf)
	n, err := io.ReadFull(r.Body, buf[:])
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF): // the whole body, in buf[:n]
		if plainReserve(buf[:n], v) {
			return nil
		}
		*v = reserveBody{}
		return decodeFrom(bytes.NewReader(buf[:n]), v)
	case err == nil: // buf is full: the body may go on
		return decodeFrom(io.MultiReader(bytes.NewReader(buf[:n]), r.Body), v)
	}
	return decodeFrom(io.MultiReader(bytes.NewReader(buf[:n]), errReader{err}), v)
}

// errReader is a body whose reading failed with err (after the bytes before it).
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// plainReserve reads b into v when b is the common body decodeReserve describes, and reports
// whether it was; v is left part-filled when it was not.
func plainReserve(b []byte, v *reserveBody) bool {
	s := string(b) // the fields are substrings of one copy, not one copy each
	i := skipSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return skipSpace(s, i+1) == len(s)
	}
	var seen uint8
	for {
		key, next, ok := plainString(s, i)
		if !ok {
			return false
		}
		f := fieldIndex(key)
		if f < 0 || seen&(1<<f) != 0 {
			return false
		}
		seen |= 1 << f
		i = skipSpace(s, next)
		if i == len(s) || s[i] != ':' {
			return false
		}
		if i, ok = plainValue(s, skipSpace(s, i+1), f, v); !ok {
			return false
		}
		i = skipSpace(s, i)
		switch {
		case i < len(s) && s[i] == ',':
			i = skipSpace(s, i+1)
		case i < len(s) && s[i] == '}':
			return skipSpace(s, i+1) == len(s)
		default:
			return false
		}
	}
}

// plainValue reads field f's value at s[i:] into v, returning where it ends.
func plainValue(s string, i, f int, v *reserveBody) (int, bool) {
	if reserveFields[f] == "quantity" {
		q, next, ok := plainInt(s, i)
		v.Quantity = q
		return next, ok
	}
	str, next, ok := plainString(s, i)
	switch reserveFields[f] {
	case "ticket":
		v.Ticket = str
	case "user_id":
		v.User = str
	case "sku":
		v.SKU = str
	case "request_key":
		v.RequestKey = str
	}
	return next, ok
}

func fieldIndex(key string) int {
	for i, f := range reserveFields {
		if f == key {
			return i
		}
	}
	return -1
}

// skipSpace is the first index from i on that is not JSON white space.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at s[i:] of printable ASCII without escapes, returning its
// content and the index after its closing quote.
func plainString(s string, i int) (string, int, bool) {
	if i == len(s) || s[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			return s[i+1 : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", 0, false
		}
	}
	return "", 0, false
}

// plainInt reads a JSON integer at s[i:] (an optional minus, then 0 or 1 to 18 digits not
// starting with 0), returning it and the index after it. What follows it is its caller's to
// check: a fraction or an exponent is no separator, so the body is refused.
func plainInt(s string, i int) (int64, int, bool) {
	neg := i < len(s) && s[i] == '-'
	if neg {
		i++
	}
	start := i
	var q int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' && i-start < 18 {
		q = q*10 + int64(s[i]-'0')
		i++
	}
	switch {
	case i == start, s[start] == '0' && i > start+1, i < len(s) && s[i] >= '0' && s[i] <= '9':
		return 0, 0, false // no digits, a leading zero, or more than 18 digits
	case neg:
		return -q, i, true
	}
	return q, i, true
}
