package region_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind: every region's writer and
// sweeper must stop on Close, and every pool is closed by testpg's cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
