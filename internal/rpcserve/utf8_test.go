package rpcserve_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/trust"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// rawCodec sends and receives a message's bytes as they are (*[]byte), so a test can put on
// the wire what no generated client would encode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, errors.New("rawCodec: want *[]byte")
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return errors.New("rawCodec: want *[]byte")
	}
	*b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// badString is a string field's bytes that are not UTF-8.
var badString = []byte{'o', 'k', 0xff, 0xfe}

// withBadString hand-encodes a message of md whose first string field (top level first, then
// inside the first message field that has one) holds badString, or, good, valid text; path
// is that field's. ok is false when md has no string field within depth.
func withBadString(md protoreflect.MessageDescriptor, good bool, depth int) (b []byte, path string, ok bool) {
	fields := md.Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); fd.Kind() == protoreflect.StringKind && !fd.IsMap() {
			v := badString
			if good {
				v = []byte("ok")
			}
			b = protowire.AppendBytes(protowire.AppendTag(nil, fd.Number(), protowire.BytesType), v)
			if fd.IsList() {
				return b, string(fd.Name()) + "[0]", true
			}
			return b, string(fd.Name()), true
		}
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || depth >= 3 {
			continue
		}
		if inner, p, found := withBadString(fd.Message(), good, depth+1); found {
			b = protowire.AppendBytes(protowire.AppendTag(nil, fd.Number(), protowire.BytesType), inner)
			if fd.IsList() {
				return b, string(fd.Name()) + "[0]." + p, true
			}
			return b, string(fd.Name()) + "." + p, true
		}
	}
	return nil, "", false
}

// inputOf is the request message of a gRPC full method name.
func inputOf(t *testing.T, method string) protoreflect.MessageDescriptor {
	t.Helper()
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		t.Fatal(err)
	}
	return d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name)).Input()
}

// TestInvalidUTF8IsInvalidArgument: over real TLS, every RPC whose request has a string field
// answers a hand-encoded request with invalid UTF-8 in it INVALID_ARGUMENT naming the field
// (not Internal), before its handler runs; the same request with valid text reaches the
// handler (Unimplemented here; health's NotFound). The open health check and the reflection stream answer the same.
func TestInvalidUTF8IsInvalidArgument(t *testing.T) {
	m := testcerts.New(t)
	s := startSecure(t, m, rpcserve.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns := map[trust.Role]*grpc.ClientConn{}
	tested := 0
	for _, method := range append(everyMethod(), "/grpc.health.v1.Health/Check") {
		role := trust.Operator
		if roles := trust.Methods[method]; len(roles) > 0 {
			role = roles[0]
		}
		if conns[role] == nil {
			conns[role] = testcerts.Dial(t, m, s.Addr(), role)
		}
		bad, path, ok := withBadString(inputOf(t, method), false, 0)
		if !ok {
			continue
		}
		good, _, _ := withBadString(inputOf(t, method), true, 0)
		tested++
		var out []byte
		err := conns[role].Invoke(ctx, method, &bad, &out, grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument || apierr.Field(err) != path || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("%s with invalid UTF-8 in %s: %v (field %q); want InvalidArgument naming %s", method, path, err, apierr.Field(err), path)
		}
		err = conns[role].Invoke(ctx, method, &good, &out, grpc.ForceCodecV2(rawCodec{}))
		if c := status.Code(err); c == codes.InvalidArgument || c == codes.Internal {
			t.Errorf("%s with valid UTF-8 in %s: %v; want it to reach the handler", method, path, err)
		}
	}
	if tested < 20 {
		t.Fatalf("only %d RPCs have a string field; the test builds fewer requests than it should", tested)
	}
	checkReflectionStream(ctx, t, conns[trust.Operator])
}

// checkReflectionStream sends the reflection stream a request whose host is not UTF-8.
func checkReflectionStream(ctx context.Context, t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), badString) // host
	if err := st.SendMsg(&req); err != nil {
		t.Fatal(err)
	}
	var out []byte
	if err := st.RecvMsg(&out); status.Code(err) != codes.InvalidArgument || apierr.Field(err) != "host" {
		t.Errorf("reflection stream with invalid UTF-8 in host: %v (field %q); want InvalidArgument naming host", err, apierr.Field(err))
	}
}
