package pgutil

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// MigrationLockID names the PostgreSQL advisory lock that a migration holds from its first
// step to its last (an arbitrary constant, not goose's default, so that another goose user of
// the same database waits on a lock of its own).
const MigrationLockID int64 = 0x71756f74614d6967 // "quotaMig"

// migrationLockWait is how long Up waits for another process's migration before it gives
// up: long enough for a step that rewrites or indexes a large holds table.
const migrationLockWait = 15 * time.Minute

// MigrateOption adjusts how migrations run.
type MigrateOption func(*migrateOptions)

type migrateOptions struct {
	log *slog.Logger
}

// MigrationLog has a migration that must wait for another process's say so, and how long it
// waited, on log: otherwise the wait, up to migrationLockWait, is silent.
func MigrationLog(log *slog.Logger) MigrateOption {
	return func(o *migrateOptions) { o.log = log }
}

// Migrator is the goose provider of the migrations in fsys (goose SQL files) and gos (Go
// migrations, for a step that must differ between PostgreSQL and CockroachDB) on pool; the
// caller calls done when finished with it.
//
// Processes that start together on one database (a region's leader and its standby, two
// coordinators) would otherwise each apply the same pending step, and all but one fail on
// it. Up holds the session advisory lock MigrationLockID on one of pool's connections while
// it runs, so the others wait (polling every second, for up to migrationLockWait), then find
// nothing left to do. A Go step that runs outside a transaction takes a second connection,
// so pool must allow two. On CockroachDB the advisory lock functions are stubs that always
// succeed, so there concurrent starts still race, as before.
func Migrator(pool *pgxpool.Pool, fsys fs.FS, gos []*goose.Migration, opts ...MigrateOption) (p *goose.Provider, done func(), err error) {
	if n := pool.Config().MaxConns; n < 2 {
		return nil, nil, fmt.Errorf("migrations: the pool allows %d connection(s); they need 2, one for the migration lock", n)
	}
	o := migrateOptions{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	inner, err := lock.NewPostgresSessionLocker(lock.WithLockID(MigrationLockID),
		lock.WithLockTimeout(1, uint64(migrationLockWait/time.Second)))
	if err != nil {
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	p, err = goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithGoMigrations(gos...),
		goose.WithSessionLocker(waitLogger{SessionLocker: inner, log: o.log}))
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	return p, func() { _ = db.Close() }, nil
}

// Migrate applies every migration of Migrator that pool has not applied yet.
func Migrate(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, gos []*goose.Migration, opts ...MigrateOption) error {
	p, done, err := Migrator(pool, fsys, gos, opts...)
	if err != nil {
		return err
	}
	defer done()
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// waitLogger takes the migration lock at once when it is free; otherwise it says that it
// waits, leaves the waiting to goose's locker, and says how long it took.
type waitLogger struct {
	lock.SessionLocker
	log *slog.Logger
}

// SessionLock takes the lock on conn, for as long as conn's session lasts or until
// SessionUnlock.
func (w waitLogger) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var free bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, MigrationLockID).Scan(&free); err == nil && free {
		return nil
	}
	w.log.Info("migrations: waiting for another process's migration of this database to finish",
		"lock", MigrationLockID, "at_most", migrationLockWait)
	start := time.Now()
	err := w.SessionLocker.SessionLock(ctx, conn)
	if err == nil {
		w.log.Info("migrations: the other process's migration finished", "waited", time.Since(start).Round(time.Millisecond))
	}
	return err
}
