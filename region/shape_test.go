package region_test

import (
	"testing"

	"github.com/quotaworks/quota/internal/testshape"
)

// TestPartsStaySmall: the Region is made of a few types with one job each (region.go names
// them: the leadership and its writer, the warm copy, the read cache, the sweeper, the
// bindings), not one type that does everything; no type or file of the package grows past
// testshape's limits.
func TestPartsStaySmall(t *testing.T) { testshape.Check(t, ".") }
