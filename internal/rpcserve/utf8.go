package rpcserve

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/quotaworks/quota/internal/apierr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request whose string field is not valid UTF-8 fails to decode, and gRPC answers every
// decoding failure Internal ("grpc: error unmarshalling request"), as if the server were at
// fault, before any interceptor sees the call. So every server decodes with utf8Codec: on
// that one failure it finds the field in the request's bytes, empties the message and marks
// it (markField, an unknown field carrying the process's markSecret and the field's path);
// refuseInvalidUTF8 (last of the unary interceptors, after authorization) and the stream
// wrapper then answer INVALID_ARGUMENT naming the field, and the handler never runs.

// markField is the field number of the mark: the largest a field may have, which no message
// of the project uses.
const markField protowire.Number = protowire.MaxValidNumber

// maxPathDepth bounds how deep findInvalidUTF8 descends into nested messages.
const maxPathDepth = 32

// markSecret starts every mark, so a client cannot mark its own request: an unknown field of
// markField without it is just an unknown field, ignored as any other.
var markSecret = func() [16]byte {
	var s [16]byte
	if _, err := rand.Read(s[:]); err != nil {
		panic("rpcserve: random mark secret: " + err.Error()) // crypto/rand does not fail on a supported OS
	}
	return s
}()

// utf8Codec is gRPC's proto codec with the one change above.
type utf8Codec struct{ encoding.CodecV2 }

// newUTF8Codec wraps the registered proto codec.
func newUTF8Codec() utf8Codec { return utf8Codec{encoding.GetCodecV2(protocodec.Name)} }

// Unmarshal decodes data into v; a string field that is not valid UTF-8 empties v and marks
// it with the field's path instead of failing.
func (c utf8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok || !isInvalidUTF8(err) {
		return err
	}
	path := findInvalidUTF8(m.ProtoReflect().Descriptor(), data.Materialize(), 0)
	if path == "" {
		path = "request" // the decoder said so, but no string field of the message holds it
	}
	proto.Reset(m)
	mark := protowire.AppendTag(nil, markField, protowire.BytesType)
	mark = protowire.AppendBytes(mark, append(markSecret[:], path...))
	m.ProtoReflect().SetUnknown(mark)
	return nil
}

// isInvalidUTF8 reports whether err is the proto decoder's refusal of a string field.
func isInvalidUTF8(err error) bool {
	var u interface{ InvalidUTF8() bool }
	if errors.As(err, &u) && u.InvalidUTF8() {
		return true
	}
	return strings.Contains(err.Error(), "invalid UTF-8")
}

// findInvalidUTF8 is the path of the first string field in b, a message of md, that is not
// valid UTF-8 ("user_id", "weights[1].region"), or "" if there is none.
func findInvalidUTF8(md protoreflect.MessageDescriptor, b []byte, depth int) string {
	seen := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		value := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			continue
		}
		i := seen[num]
		seen[num]++
		content, _ := protowire.ConsumeBytes(value) // well formed: ConsumeFieldValue read it
		name := string(fd.Name())
		if fd.IsList() {
			name += "[" + strconv.Itoa(i) + "]"
		}
		switch {
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(content):
			return name
		case fd.Message() != nil && depth < maxPathDepth:
			if inner := findInvalidUTF8(fd.Message(), content, depth+1); inner != "" {
				return name + "." + inner
			}
		}
	}
	return ""
}

// markedField is the path a request's mark names; ok false when it has none.
func markedField(req any) (path string, ok bool) {
	m, isMsg := req.(proto.Message)
	if !isMsg {
		return "", false
	}
	u := m.ProtoReflect().GetUnknown()
	for len(u) > 0 {
		num, typ, n := protowire.ConsumeField(u)
		if n < 0 {
			return "", false
		}
		if num == markField && typ == protowire.BytesType {
			_, _, tn := protowire.ConsumeTag(u)
			v, _ := protowire.ConsumeBytes(u[tn:n])
			if rest, found := bytes.CutPrefix(v, markSecret[:]); found {
				return string(rest), true
			}
		}
		u = u[n:]
	}
	return "", false
}

// invalidUTF8 is the refusal of a marked request, or nil.
func invalidUTF8(req any) error {
	path, ok := markedField(req)
	if !ok {
		return nil
	}
	return apierr.Invalid(path, "is not valid UTF-8 (a protobuf string field must be)")
}

// refuseInvalidUTF8 answers a request utf8Codec marked INVALID_ARGUMENT (mapErrors maps it)
// without calling the handler.
func refuseInvalidUTF8(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := invalidUTF8(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// refuseInvalidUTF8Stream is refuseInvalidUTF8 for the messages a stream receives.
func refuseInvalidUTF8Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, utf8Stream{ss})
}

// utf8Stream refuses a marked message as it is received.
type utf8Stream struct{ grpc.ServerStream }

// RecvMsg receives m, then answers INVALID_ARGUMENT if utf8Codec marked it.
func (s utf8Stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return apierr.ToStatus(invalidUTF8(m))
}
