package coordinator_test

import (
	"testing"

	"github.com/quotaworks/quota/internal/testshape"
)

// TestPartsStaySmall: the Coordinator is a facade over a few types with one job each
// (coordinator.go names them), not one type that does everything; no type or file of the
// package grows past testshape's limits.
func TestPartsStaySmall(t *testing.T) { testshape.Check(t, ".") }
