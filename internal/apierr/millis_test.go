package apierr_test

import (
	"errors"
	"math"
	"testing"

	"github.com/quotaworks/quota/internal/apierr"
)

// TestMillis: every count a duration holds converts exactly; one it does not is refused
// naming the field, never wrapped around into another duration (2^58 ms + 60,000 ms, is
// 15,625 × 2^64 ns + 60 s, would become 60 s).
func TestMillis(t *testing.T) {
	for _, ms := range []int64{0, 1, -1, 60_000, apierr.MaxMillis, -apierr.MaxMillis} {
		if d, err := apierr.Millis("hold_ttl", ms); err != nil || d.Milliseconds() != ms {
			t.Errorf("Millis(%d) = %s, %v", ms, d, err)
		}
	}
	for _, ms := range []int64{apierr.MaxMillis + 1, -apierr.MaxMillis - 1, 1<<58 + 60_000, math.MaxInt64, math.MinInt64} {
		var inv *apierr.InvalidError
		if d, err := apierr.Millis("hold_ttl", ms); !errors.As(err, &inv) || inv.Field != "hold_ttl" {
			t.Errorf("Millis(%d) = %s, %v; want INVALID_ARGUMENT on hold_ttl", ms, d, err)
		}
	}
}
