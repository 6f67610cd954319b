package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/clock"
)

// Sleep waits its duration, or returns ctx's error as soon as ctx ends.
func TestSleep(t *testing.T) {
	start := time.Now()
	if err := clock.Sleep(context.Background(), 20*time.Millisecond); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("Sleep returned %v after %s, want nil after 20ms", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := clock.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Fatalf("Sleep of an ended context returned %v after %s, want context.Canceled at once", err, time.Since(start))
	}
}
