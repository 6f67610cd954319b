// Package transfer is the pure logic of moving units between pools: quantities, transfer
// states and their allowed transitions, identifiers, and the records both sides keep so an
// auditor can match them by transfer id. It does no I/O.
package transfer

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Units counts units of stock. Every stock quantity in the project is Units, never a bare int.
type Units int64

// MaxUnits bounds any one quantity, so sums over regions cannot overflow int64.
const MaxUnits Units = 1 << 40

// Unallocated is the pool name of the coordinator's unallocated units, the source of every
// initial allocation.
const Unallocated = "unallocated"

// MaxIDLen bounds every identifier (sale, SKU, user, key, hold, transfer, payment).
const MaxIDLen = 128

// idByte marks the bytes an identifier may hold: letters, digits and . _ : @ / + = -. A
// table, not a regexp: every reservation checks four ids, and a regexp match cost more than
// a microsecond of the hot path's budget (FuzzCheckID holds it equal to the pattern
// ^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$).
var idByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "._:@/+=-" {
		t[c] = true
	}
	return t
}()

// validID says whether id is made of idByte bytes and starts with a letter or digit.
func validID(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !idByte[id[i]] {
			return false
		}
	}
	c := id[0]
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

var regionPattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// CheckID reports why id is not a valid identifier, or "" when it is. Identifiers are
// 1..MaxIDLen printable ASCII characters from a conservative set, so they are safe in logs,
// keys and file names.
func CheckID(id string) string {
	switch {
	case id == "":
		return "must not be empty"
	case len(id) > MaxIDLen:
		return fmt.Sprintf("is %d bytes, longer than %d", len(id), MaxIDLen)
	case !validID(id):
		return "may contain only letters, digits and . _ : @ / + = - and must start with a letter or digit"
	}
	return ""
}

// CheckRegion reports why name is not a valid region name, or "" when it is.
func CheckRegion(name string) string {
	switch {
	case name == "":
		return "must not be empty"
	case name == Unallocated:
		return "is reserved for the coordinator's pool"
	case !regionPattern.MatchString(name):
		return "must be 1..32 lowercase letters, digits or '-', starting with a letter"
	}
	return ""
}

// MaxReasonLen is the longest reason a pause may carry, in bytes, at the coordinator and at
// every region.
const MaxReasonLen = 1024

// AsText makes s a text CheckText(s, max) accepts: control characters become spaces, invalid
// UTF-8 is dropped, and it is cut to at most max bytes on a character boundary. It is for
// text a process writes itself from other text (the continuous audit's evidence).
func AsText(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if len(s) > max {
		s = s[:max]
		for !utf8.ValidString(s) { // the cut split a character: at most three bytes go
			s = s[:len(s)-1]
		}
	}
	return s
}

// CheckText says why s cannot be a short free text a person wrote (a pause's reason, shown to
// buyers and in logs), or "" when it can: valid UTF-8, no control characters (NUL, escape
// sequences, new lines), at most max bytes.
func CheckText(s string, max int) string {
	switch {
	case len(s) > max:
		return fmt.Sprintf("%d bytes; at most %d", len(s), max)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "contains a control character (a new line, an escape, NUL, ...)"
	}
	return ""
}
