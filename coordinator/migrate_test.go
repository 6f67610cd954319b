package coordinator_test

import (
	"testing"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/testpg"
)

// TestConcurrentMigrations: coordinators, each a new binary, start together and each migrate
// the ledger database; every one succeeds and every step is applied once.
func TestConcurrentMigrations(t *testing.T) {
	testpg.MigrateConcurrently(t, "migratecoord", coordinator.Migrate)
}
