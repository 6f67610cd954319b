// Package pgutil opens PostgreSQL databases, creates them when missing, applies a
// package's versioned migrations with goose, and runs transactions with the
// CockroachDB-compatible retry loop.
package pgutil

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

var dbNamePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// WithDatabase returns baseURL with its database replaced by name.
func WithDatabase(baseURL, name string) (string, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", fmt.Errorf("pg url: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", fmt.Errorf("pg url %q: scheme must be postgres://", redact(baseURL))
	}
	u.Path = "/" + name
	return u.String(), nil
}

// EnsureDatabase creates database name on the server of adminURL when it does not exist.
func EnsureDatabase(ctx context.Context, adminURL, name string) error {
	if !dbNamePattern.MatchString(name) {
		return fmt.Errorf("database name %q: must be lowercase letters, digits and _", name)
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect %s: %w", redact(adminURL), err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // created concurrently by another process
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// DropDatabase removes database name (tests use it to clean up).
func DropDatabase(ctx context.Context, adminURL, name string) error {
	if !dbNamePattern.MatchString(name) {
		return fmt.Errorf("database name %q: must be lowercase letters, digits and _", name)
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect %s: %w", redact(adminURL), err)
	}
	defer conn.Close(context.Background())
	for attempt := 1; ; attempt++ {
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || pe.Code != "42501" || attempt == dropAttempts {
			return err
		}
		// FORCE refuses to end a process of no role it may signal, such as an autovacuum
		// worker that picked the database up; a plain DROP makes autovacuum let go of it
		// (it fails instead if a session came back meanwhile: then FORCE again).
		if _, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name); err == nil {
			return nil
		}
	}
}

// dropAttempts bounds DropDatabase's rounds of FORCE then plain DROP.
const dropAttempts = 5

// Open connects a pool to url with at most maxConns connections.
func Open(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("pg url %s: %w", redact(dbURL), err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.AfterConnect, cfg.BeforeClose = recordBackendStart, forgetBackendStart
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", redact(dbURL), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping %s: %w", redact(dbURL), err)
	}
	return pool, nil
}

// MigrationLockID names the PostgreSQL advisory lock that a migration holds from its first
// step to its last (an arbitrary constant, not goose's default, so that another goose user of
// the same database waits on a lock of its own).
const MigrationLockID int64 = 0x71756f74614d6967 // "quotaMig"

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
func Migrator(pool *pgxpool.Pool, fsys fs.FS, gos ...*goose.Migration) (p *goose.Provider, done func(), err error) {
	if n := pool.Config().MaxConns; n < 2 {
		return nil, nil, fmt.Errorf("migrations: the pool allows %d connection(s); they need 2, one for the migration lock", n)
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(MigrationLockID),
		lock.WithLockTimeout(1, uint64(migrationLockWait/time.Second)))
	if err != nil {
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	p, err = goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithGoMigrations(gos...), goose.WithSessionLocker(locker))
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	return p, func() { _ = db.Close() }, nil
}

// migrationLockWait is how long Up waits for another process's migration before it gives
// up: long enough for a step that rewrites or indexes a large holds table.
const migrationLockWait = 15 * time.Minute

// Migrate applies every migration of Migrator(pool, fsys, gos...) that pool has not applied yet.
func Migrate(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, gos ...*goose.Migration) error {
	p, done, err := Migrator(pool, fsys, gos...)
	if err != nil {
		return err
	}
	defer done()
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Tx runs fn in a transaction and commits it, retrying the whole transaction on a
// serialization failure (SQLSTATE 40001), as CockroachDB requires and PostgreSQL allows. fn
// must be safe to run more than once. The error of COMMIT itself is returned: a commit that
// fails is never reported as success. (cockroach-go's ExecuteTx is not used here because it
// treats RELEASE SAVEPOINT as the commit and ignores COMMIT's error, which on PostgreSQL
// is the real commit.)
func Tx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return runTx(ctx, pool, pgx.TxOptions{}, fn)
}

// ReadTx runs fn in one read-only, repeatable-read transaction: a consistent snapshot.
func ReadTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return runTx(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

func runTx(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := func() error {
			tx, err := pool.BeginTx(ctx, opts)
			if err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}()
		if IsRetryable(err) && ctx.Err() == nil && attempt < 100 {
			continue
		}
		return err
	}
}

// IsRetryable reports a serialization failure: the transaction did not commit and may be
// run again.
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable url)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return strings.TrimSpace(u.String())
}
