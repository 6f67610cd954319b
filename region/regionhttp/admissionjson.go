package regionhttp

import (
	"encoding/json"
	"strconv"
	"time"
)

// marshalAdmission is json.Marshal(a) and a new line. Every admission poll answers one, so
// the common admission (its strings printable ASCII that JSON writes as they are, its expiry
// between years 1 and 9999) is written without reflection; any other goes to json.Marshal.
// TestMarshalAdmissionIsMarshal and FuzzMarshalAdmission hold the two to the same bytes.
func marshalAdmission(a *admissionJSON) []byte {
	b := make([]byte, 0, 192+len(a.Ticket))
	if b, ok := appendAdmission(b, a); ok {
		return append(b, '\n')
	}
	out, err := json.Marshal(a)
	if err != nil { // strings, numbers and a time of years 0 to 9999 always marshal
		panic("regionhttp: marshal an admission: " + err.Error())
	}
	return append(out, '\n')
}

// appendAdmission appends a as json.Marshal writes it, or reports false when a has a string
// JSON would escape or an expiry not in UTC or outside years 1 to 9999.
func appendAdmission(b []byte, a *admissionJSON) ([]byte, bool) {
	ok := true
	str := func(name, v string, omitEmpty bool) {
		if omitEmpty && v == "" {
			return
		}
		ok = ok && plainJSON(v)
		b = append(b, ',', '"')
		b = append(b, name...)
		b = append(b, '"', ':', '"')
		b = append(b, v...)
		b = append(b, '"')
	}
	num := func(name string, v int64) {
		if v != 0 {
			b = append(b, ',', '"')
			b = append(b, name...)
			b = append(b, '"', ':')
			b = strconv.AppendInt(b, v, 10)
		}
	}
	b = append(b, `{"admission_id":"`...)
	ok = plainJSON(a.Admission)
	b = append(b, a.Admission...)
	b = append(b, '"')
	str("sale_id", a.Sale, false)
	str("state", a.State, false)
	num("position", a.Position)
	num("estimated_wait_ms", a.EstimatedWaitMs)
	num("retry_after_ms", a.RetryAfterMs)
	str("ticket", a.Ticket, true)
	if t := a.ExpiresAt; t != nil {
		if y := t.Year(); y < 1 || y > 9999 || t.Location() != time.UTC {
			return b, false
		}
		b = append(b, `,"expires_at":"`...)
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	str("region", a.Region, true)
	str("sku", a.SKU, true)
	str("reason", a.Reason, true)
	return append(b, '}'), ok
}

// plainJSON reports whether json.Marshal writes s as it is between quotes: printable ASCII
// but for '"', '\\' and the HTML characters it escapes ('<', '>', '&').
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
