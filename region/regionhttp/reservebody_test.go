package regionhttp

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// storefrontBody is a reserve's body as a storefront sends it (and the benchmark's wrk).
const storefrontBody = `{"ticket":"v1.AQAGaGItc29sZAABcwACdXMAAWEAAAAIAAABlBzCJZgABWsxMjM0.` +
	`c2lnbmF0dXJlLW9mLTMyLWJ5dGVzLWxvbmctaGVyZS4uLi4","sku":"a","quantity":1,"request_key":"so-0-17"}`

// bodyRequest is a reserve with body b, bounded as the edge bounds it.
func bodyRequest(b []byte) *http.Request {
	r := httptest.NewRequest("POST", "/v1/sales/s/reservations", bytes.NewReader(b))
	r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, MaxBody)
	return r
}

// bothWays decodes b with decodeReserve and with decode, the reflecting decoder, and fails
// unless their answers (the body, or the error's text) are the same.
func bothWays(t *testing.T, b []byte) {
	t.Helper()
	var fast, slow reserveBody
	ferr := decodeReserve(bodyRequest(b), &fast)
	serr := decode(bodyRequest(b), &slow)
	if (ferr == nil) != (serr == nil) || ferr != nil && ferr.Error() != serr.Error() {
		t.Fatalf("body %q: decodeReserve says %v, decode %v", b, ferr, serr)
	}
	if ferr == nil && !reflect.DeepEqual(fast, slow) {
		t.Fatalf("body %q: decodeReserve read %+v, decode %+v", b, fast, slow)
	}
}

// reserveBodies are bodies of every kind: the common ones plainReserve reads, and the ones it
// leaves to decode (escapes, other spellings, duplicates, nulls, wrong types, numbers it does
// not read, trailing data, bad JSON, over peekSize and over MaxBody).
var reserveBodies = []string{
	storefrontBody,
	`{"user_id":"u1","sku":"a","quantity":2,"request_key":"k"}`,
	" \t\r\n{ \"sku\" : \"a\" ,\n\"quantity\":-0 , \"request_key\":\"k\"}\n ",
	`{}`, ` { } `, `{"quantity":999999999999999999}`, `{"quantity":-999999999999999999}`,
	`{"quantity":9999999999999999999}`, `{"quantity":99999999999999999999}`, `{"quantity":1.0}`,
	`{"quantity":1e2}`, `{"quantity":01}`, `{"quantity":-}`, `{"quantity":"1"}`, `{"quantity":null}`,
	`{"quantity":true}`, `{"sku":"a\"b"}`, `{"sku":"\u0061"}`, `{"sku":"é"}`, "{\"sku\":\"a\x01\"}",
	"{\"sku\":\"\xff\"}", `{"sku":1}`, `{"sku":null}`, `{"SKU":"a"}`, `{"Sku":"a"}`, `{"ſku":"a"}`,
	`{"sku":"a","sku":"b"}`, `{"other":1}`, `{"sku":"a",}`, `{"sku":"a"`, `{"sku":"a"}}`, `{"sku":"a"}]`,
	`{"sku":"a"} {}`, `{"sku":"a"} x`, `[]`, `"a"`, `null`, ``, ` `, `{`, `{"sku"}`, `{"sku":}`,
	`{"sku" "a"}`, `{,}`, `{"":"a"}`, `{"ticket":""}`, `{"quantity":}`, `{"quantity":-1}`,
	`{"sku":"a"}` + strings.Repeat(" ", peekSize), `{"sku":"` + strings.Repeat("a", peekSize) + `"}`,
	`{"sku":"` + strings.Repeat("a", MaxBody) + `"}`, `{"sku":"a"}` + strings.Repeat(" ", MaxBody),
	// carts: lines in place of sku and quantity
	`{"user_id":"u1","lines":[{"sku":"phone","quantity":1},{"sku":"case","quantity":1}],"request_key":"k"}`,
	`{"lines":[]}`, `{"lines":null}`, `{"lines":{}}`, `{"lines":[{"sku":1}]}`, `{"lines":[{"other":1}]}`,
	`{"lines":[null]}`, `{"lines":[{"quantity":"1"}]}`, `{"sku":"a","lines":[{"sku":"a","quantity":1}]}`,
}

// TestDecodeReserveIsDecode checks decodeReserve against decode on every kind of body: the
// same body read or the same error, and that the common bodies take the plain path.
func TestDecodeReserveIsDecode(t *testing.T) {
	for _, b := range reserveBodies {
		bothWays(t, []byte(b))
	}
	for _, b := range reserveBodies[:3] {
		var v reserveBody
		if !plainReserve([]byte(b), &v) {
			t.Errorf("%q: not read by plainReserve", b)
		}
	}
	var v reserveBody
	if err := decodeReserve(bodyRequest([]byte(storefrontBody)), &v); err != nil || v.SKU != "a" || v.Quantity != 1 ||
		v.RequestKey != "so-0-17" || !strings.HasPrefix(v.Ticket, "v1.AQ") || v.User != "" {
		t.Errorf("the storefront's body: %+v, %v", v, err)
	}
}

// FuzzDecodeReserve checks decodeReserve against decode on any body.
func FuzzDecodeReserve(f *testing.F) {
	for _, b := range reserveBodies {
		if len(b) < 4096 {
			f.Add([]byte(b))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) { bothWays(t, b) })
}

// rewindBody is a request body read again from its start after each Close, so one request
// serves many decodes.
type rewindBody struct{ *bytes.Reader }

func (b rewindBody) Close() error {
	_, err := b.Seek(0, io.SeekStart)
	return err
}

// TestDecodeReserveAllocs pins the cost of reading a storefront's body: one copy of it (the
// fields' strings), no reflection. Every reserve reads one, sold-out answers too.
func TestDecodeReserveAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("-race drops sync.Pool items at random; allocations are pinned in the run without -race")
	}
	r := httptest.NewRequest("POST", "/v1/sales/s/reservations", nil)
	body := rewindBody{bytes.NewReader([]byte(storefrontBody))}
	r.Body = body
	var v reserveBody
	n := testing.AllocsPerRun(200, func() {
		if err := decodeReserve(r, &v); err != nil {
			t.Fatal(err)
		}
		if err := body.Close(); err != nil {
			t.Fatal(err)
		}
	})
	if n > 1 {
		t.Errorf("decodeReserve of a storefront's body allocates %v times; want at most 1", n)
	}
}
