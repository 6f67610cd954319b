package regionrpc

import (
	"math"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// maxMillis is the most milliseconds a time.Duration holds (about 292 years).
const maxMillis = math.MaxInt64 / int64(time.Millisecond)

// millis is a request's count of milliseconds as a duration. A count no duration holds is
// refused naming field: multiplied as it is, it would wrap around into another duration,
// which may well pass the region's checks (2^58 ms + 60,000 ms is 60 s).
func millis(field string, ms int64) (time.Duration, error) {
	if ms > maxMillis || ms < -maxMillis {
		return 0, apierr.Invalid(field, "%d ms is out of range (at most %d)", ms, maxMillis)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
