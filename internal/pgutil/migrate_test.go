package pgutil_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
)

// TestConcurrentMigrations: processes that start together (a region's leader and its
// standby, or two coordinators, each a new binary) each migrate the same database; every one
// of them must succeed, and every step must be applied once. The database has goose's version
// table already, as every database a release upgrades has: on a new one, goose's own retry
// of creating that table happens to keep a quick migration from racing.
func TestConcurrentMigrations(t *testing.T) {
	for _, tc := range []struct {
		name    string
		migrate func(context.Context, *pgxpool.Pool, ...pgutil.MigrateOption) error
		table   string
	}{
		{"region", region.Migrate, "holds"},
		{"coordinator", coordinator.Migrate, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			u := testpg.NewDB(t, "migrate"+tc.name)
			const processes = 4
			pools := make([]*pgxpool.Pool, processes)
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
			errs := make([]error, processes)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, p := range pools {
				wg.Go(func() {
					<-start
					errs[i] = tc.migrate(ctx, p)
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
			if err := tc.migrate(ctx, pools[0]); err != nil {
				t.Errorf("migrating again: %v", err)
			}
		})
	}
}

// createVersionTable leaves goose's version table, at version 0, in pool's database.
func createVersionTable(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
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

// TestMigratorNeedsTwoConnections: a pool of one connection would deadlock a Go step that
// runs outside a transaction while the lock's connection is held; it is refused up front.
func TestMigratorNeedsTwoConnections(t *testing.T) {
	ctx := context.Background()
	pool, err := pgutil.Open(ctx, testpg.NewDB(t, "migrateone"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	err = region.Migrate(ctx, pool)
	if err == nil || !strings.Contains(err.Error(), "need 2") {
		t.Fatalf("migrating through a pool of 1: %v, want an error saying it needs 2", err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%d tables after the refused migration (%v), want none", tables, err)
	}
}

// syncBuffer is a log destination that a test reads while a migration writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMigrationWaitIsLogged: a migration that finds the lock taken says that it waits, waits
// until the lock is free, and then says how long it waited.
func TestMigrationWaitIsLogged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := testpg.NewDB(t, "migratewait")
	holder, err := pgutil.Open(ctx, u, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	conn, err := holder.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, pgutil.MigrationLockID); err != nil {
		t.Fatal(err)
	}
	pool, err := pgutil.Open(ctx, u, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	result := make(chan error, 1)
	go func() { result <- region.Migrate(ctx, pool, pgutil.MigrationLog(log)) }()
	for !strings.Contains(out.String(), "waiting for another process") {
		select {
		case err := <-result:
			t.Fatalf("the migration ended (%v) while another session held the lock; log: %s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, pgutil.MigrationLockID); err != nil {
		t.Fatal(err)
	}
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "waited=") {
		t.Errorf("no line saying how long it waited: %s", out.String())
	}
}
