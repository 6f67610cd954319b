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
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
)

// migrations is a migration set of this package's own: one step that makes a table.
var migrations = fstest.MapFS{"00001_table.sql": {Data: []byte("-- +goose Up\nCREATE TABLE t (id int);\n")}}

// migrate applies migrations to pool.
func migrate(ctx context.Context, pool *pgxpool.Pool, opts ...pgutil.MigrateOption) error {
	return pgutil.Migrate(ctx, pool, migrations, nil, opts...)
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
	err = migrate(ctx, pool)
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
	go func() { result <- migrate(ctx, pool, pgutil.MigrationLog(log)) }()
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
