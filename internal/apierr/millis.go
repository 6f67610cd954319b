package apierr

import (
	"math"
	"time"
)

// MaxMillis is the most milliseconds a time.Duration holds (about 292 years).
const MaxMillis = math.MaxInt64 / int64(time.Millisecond)

// Millis is a request's count of milliseconds as a duration, for the adapters that read
// one off the wire. A count no duration holds is refused INVALID_ARGUMENT naming field:
// multiplied as it is, it would wrap around into another duration, which may well pass the
// domain's checks (2^58 ms + 60,000 ms is 60 s).
func Millis(field string, ms int64) (time.Duration, error) {
	if ms > MaxMillis || ms < -MaxMillis {
		return 0, Invalid(field, "%d ms is out of range (at most %d)", ms, MaxMillis)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
