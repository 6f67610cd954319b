// Package pgutil opens PostgreSQL databases, creates them when missing, applies a
// package's versioned migrations with goose, and runs transactions with the
// CockroachDB-compatible retry loop.
package pgutil

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var dbNamePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// WithDatabase returns baseURL with its database replaced by name.
func WithDatabase(baseURL, name string) (string, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", fmt.Errorf("pg url %s: %w", redact(baseURL), urlError(err))
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

// dsnPassword matches the password of a key=value connection string, quoted or not.
var dsnPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// redact is s, a postgres:// URL or a key=value connection string, with any password
// replaced by xxxxx, for errors and logs.
func redact(s string) string {
	if !strings.Contains(s, "://") {
		return dsnPassword.ReplaceAllString(strings.TrimSpace(s), "${1}xxxxx")
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable url)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return strings.TrimSpace(u.String())
}

// urlError is err of url.Parse without the URL it quotes, which may carry a password.
func urlError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// GrantRead grants role SELECT on every table of the database's public schema, now and for
// tables made later by the same owner, when role exists (it does nothing otherwise). The
// grants are idempotent; a database role that may not grant is an error.
func GrantRead(ctx context.Context, pool *pgxpool.Pool, role string) error {
	if !validRole.MatchString(role) {
		return fmt.Errorf("reader role %q: want lower-case letters, digits and _", role)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		return fmt.Errorf("look up role %s: %w", role, err)
	}
	if !exists {
		return nil
	}
	// Processes migrating the same database at once would grant at once, and concurrent
	// GRANTs on one object fail ("tuple concurrently updated"): one at a time.
	return Tx(ctx, pool, func(tx pgx.Tx) error {
		for _, stmt := range []string{
			`SELECT pg_advisory_xact_lock(hashtext('quota: grant read access'))`,
			`GRANT SELECT ON ALL TABLES IN SCHEMA public TO ` + role,
			`ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO ` + role,
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("grant %s read access: %w", role, err)
			}
		}
		return nil
	})
}

var validRole = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
