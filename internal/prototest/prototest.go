// Package prototest helps the adapters' tests check their conversions to protobuf messages:
// Unset lists the fields a conversion left at their zero value, so a test that converts a
// domain value with every field set finds a field the adapter forgot.
package prototest

import (
	"strconv"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxDepth bounds how deep Unset descends into nested messages.
const maxDepth = 16

// Unset is the path of every field of m, and of the messages m holds (each list element,
// each map value), that is unset or at its zero value ("skus[0].allocated", ...), but for
// those whose name is in skip. A nil m is "" (the message itself).
func Unset(m proto.Message, skip ...string) []string {
	if m == nil {
		return []string{""}
	}
	skipped := map[string]bool{}
	for _, s := range skip {
		skipped[s] = true
	}
	var out []string
	unset(m.ProtoReflect(), "", skipped, 0, &out)
	return out
}

func unset(m protoreflect.Message, prefix string, skip map[string]bool, depth int, out *[]string) {
	if !m.IsValid() {
		*out = append(*out, prefix)
		return
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := string(fd.Name())
		if skip[name] {
			continue
		}
		path := prefix + name
		if !m.Has(fd) {
			*out = append(*out, path)
			continue
		}
		if depth >= maxDepth || fd.Message() == nil {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			for j := range l.Len() {
				unset(l.Get(j).Message(), path+"["+strconv.Itoa(j)+"].", skip, depth+1, out)
			}
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				m.Get(fd).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
					unset(v.Message(), path+"["+k.String()+"].", skip, depth+1, out)
					return true
				})
			}
		default:
			unset(m.Get(fd).Message(), path+".", skip, depth+1, out)
		}
	}
}
