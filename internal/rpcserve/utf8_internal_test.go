package rpcserve

import (
	"errors"
	"testing"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// str appends field num holding s, as the wire has it (not checked for UTF-8).
func str(b []byte, num protowire.Number, s string) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), []byte(s))
}

// TestUTF8CodecNamesTheField: the codec decodes a good request as gRPC's does; a request with
// invalid UTF-8 decodes empty and marked with the path of the first bad field, nested and
// repeated fields by their place; a mark a client sends itself, without the process's
// secret, marks nothing.
func TestUTF8CodecNamesTheField(t *testing.T) {
	c := newUTF8Codec()
	weight := func(region string) []byte { return str(nil, 1, region) }
	for _, tc := range []struct {
		name string
		wire []byte
		want string // "" for a good request
	}{
		{"good", str(str(nil, 1, "s1"), 3, "req-1"), ""},
		{"top level, after a good field", str(str(nil, 1, "s1"), 3, "r\xff"), "request_id"},
		{"nested, second of a list", str(str(str(nil, 1, "s1"), 2, string(weight("us"))), 2, string(weight("e\xc0u"))), "weights[1].region"},
	} {
		var req quotav1.AllocateRequest
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.wire)}, &req); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		err := invalidUTF8(&req)
		var inv *apierr.InvalidError
		switch {
		case tc.want == "" && (err != nil || req.GetSaleId() != "s1"):
			t.Errorf("%s: %v, %v; want it decoded", tc.name, &req, err)
		case tc.want != "" && (!errors.As(err, &inv) || inv.Field != tc.want || req.GetSaleId() != ""):
			t.Errorf("%s: %v (decoded %v); want invalid %s and nothing decoded", tc.name, err, &req, tc.want)
		}
	}
	spoof := protowire.AppendBytes(protowire.AppendTag(str(nil, 1, "s1"), markField, protowire.BytesType), []byte("0123456789abcdefsale_id"))
	var req quotav1.AllocateRequest
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(spoof)}, &req); err != nil {
		t.Fatal(err)
	}
	if err := invalidUTF8(&req); err != nil || req.GetSaleId() != "s1" {
		t.Errorf("a client's own mark: %v, %v; want an ignored unknown field", &req, err)
	}
}
