package region_test

import (
	"testing"

	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
)

// TestConcurrentMigrations: a region's leader and its standby, each a new binary, start
// together and each migrate the same database; every one succeeds and every step is applied
// once.
func TestConcurrentMigrations(t *testing.T) {
	testpg.MigrateConcurrently(t, "migrateregion", region.Migrate)
}
