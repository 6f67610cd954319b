package testpg

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
)

// MigrateFunc is a component's migration (region.Migrate, coordinator.Migrate).
type MigrateFunc func(context.Context, *pgxpool.Pool, ...pgutil.MigrateOption) error

// migratingProcesses is how many processes MigrateConcurrently starts together.
const migratingProcesses = 4

// MigrateConcurrently runs migrate from several processes (a pool each) at once on a new
// database, as a region's leader and its standby, or two coordinators, each a new binary,
// do; every one must succeed, every step must be applied once, and migrating again must
// succeed too. The database has goose's version table already, as every database a release
// upgrades has: on a new one, goose's own retry of creating that table happens to keep a
// quick migration from racing.
func MigrateConcurrently(t testing.TB, prefix string, migrate MigrateFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := NewDB(t, prefix)
	pools := make([]*pgxpool.Pool, migratingProcesses)
	defer func() {
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
	}()
	for i := range pools {
		p, err := pgutil.Open(ctx, u, 4)
		if err != nil {
			t.Fatal(err)
		}
		pools[i] = p
	}
	createVersionTable(ctx, t, pools[0])
	errs := make([]error, len(pools))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range pools {
		wg.Go(func() {
			<-start
			errs[i] = migrate(ctx, p)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("process %d: %v", i, err)
		}
	}
	var applied, versions int64
	if err := pools[0].QueryRow(ctx, `SELECT count(*), count(DISTINCT version_id) FROM goose_db_version WHERE version_id > 0`).Scan(&applied, &versions); err != nil {
		t.Fatal(err)
	}
	if applied != versions {
		t.Errorf("goose_db_version has %d rows for %d versions: a step was applied twice", applied, versions)
	}
	if err := migrate(ctx, pools[0]); err != nil {
		t.Errorf("migrating again: %v", err)
	}
}

// createVersionTable leaves goose's version table, at version 0, in pool's database.
func createVersionTable(ctx context.Context, t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	fsys := fstest.MapFS{"00001_noop.sql": {Data: []byte("-- +goose Up\nSELECT 1;\n")}}
	p, done, err := pgutil.Migrator(pool, fsys, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if v, err := p.GetDBVersion(ctx); err != nil || v != 0 {
		t.Fatalf("version table: version %d, %v", v, err)
	}
}
