package region

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/quotaworks/quota/internal/pgutil"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate applies the region schema's pending migrations to pool, under the migration lock
// (pgutil.Migrator).
//
// It then grants ReaderRole SELECT on every table, when that role exists (scripts/pg-setup.sh
// creates it): the coordinator may read a region's database as a role that cannot change it.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...pgutil.MigrateOption) error {
	sub, gos, err := schema()
	if err != nil {
		return err
	}
	if err := pgutil.Migrate(ctx, pool, sub, gos, opts...); err != nil {
		return err
	}
	return pgutil.GrantRead(ctx, pool, ReaderRole)
}

// ReaderRole is the PostgreSQL role granted read-only access to a region's tables.
const ReaderRole = "quota_reader"

// migrator is the region schema's goose provider on pool, for tests that stop part way.
func migrator(pool *pgxpool.Pool, opts ...pgutil.MigrateOption) (*goose.Provider, func(), error) {
	sub, gos, err := schema()
	if err != nil {
		return nil, nil, err
	}
	return pgutil.Migrator(pool, sub, gos, opts...)
}

// schema is the region schema: its SQL files and its Go steps.
func schema() (fs.FS, []*goose.Migration, error) {
	sub, err := fs.Sub(migrations, "migrations")
	return sub, []*goose.Migration{holdKeysInByteOrder, holdsByChange}, err
}

// holdKeysInByteOrder is migration 5. Every hold insert is on a batch's critical path, and a
// hold's text keys are compared dozens of times per insert in three indexes. Under a
// database's libc collation (C.UTF-8 on Debian, which PostgreSQL 15 does not treat as C)
// each comparison is a strcoll call; in byte order (COLLATE "C") it is a memcmp, and nothing
// sorts holds for people to read. CockroachDB compares strings byte by byte already and does
// not take COLLATE "C" on a column, so there the step does nothing. PostgreSQL rewrites the
// table and its indexes under an exclusive lock: the region's writes wait for it. A Go
// migration because the SQL differs by database.
var holdKeysInByteOrder = goose.NewGoMigration(5,
	&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error { return collateHoldKeys(ctx, tx, `"C"`) }},
	&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error { return collateHoldKeys(ctx, tx, `"default"`) }})

func collateHoldKeys(ctx context.Context, tx *sql.Tx, collation string) error {
	var version string
	if err := tx.QueryRowContext(ctx, `SELECT version()`).Scan(&version); err != nil {
		return fmt.Errorf("migration 5: %w", err)
	}
	if strings.Contains(version, "CockroachDB") {
		return nil
	}
	cols := []string{"hold_id", "sale_id", "sku", "user_id", "request_key", "state"}
	alters := make([]string, len(cols))
	for i, c := range cols {
		alters[i] = fmt.Sprintf("ALTER COLUMN %s TYPE text COLLATE %s", c, collation)
	}
	if _, err := tx.ExecContext(ctx, "ALTER TABLE holds "+strings.Join(alters, ", ")); err != nil {
		return fmt.Errorf("migration 5: holds' keys in collation %s: %w", collation, err)
	}
	return nil
}

// holdsByChange is migration 7: the index a warm standby reads the holds changed since its
// last refresh through (region/standby.go; stamps rise, so entries go in at its right edge).
// It is built CONCURRENTLY, outside a transaction, so that a leader serving from the same
// database during a rolling upgrade is not held up for the whole build. A concurrent build
// that failed (the process killed during it) leaves an invalid index of the same name, which
// IF NOT EXISTS would take for done: such an index is dropped and built again, and the step
// fails unless the index it leaves is valid, so a standby never reads every hold on every
// refresh unnoticed. Migrations run under the migration lock (pgutil.Migrator), so another
// migrator's build is never under way beside this one; but a build whose process died (pgx
// closes the connection without cancelling the server's statement) can still be running.
// DROP INDEX CONCURRENTLY waits for it, and the index is built again: time lost, nothing else.
var holdsByChange = goose.NewGoMigration(7,
	&goose.GoFunc{RunDB: createHoldsByChange},
	&goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error {
		_, err := db.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS holds_by_change`)
		return err
	}})

func createHoldsByChange(ctx context.Context, db *sql.DB) error {
	valid := func() (exists, ok bool, err error) {
		err = db.QueryRowContext(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('holds_by_change')`).Scan(&ok)
		if errors.Is(err, sql.ErrNoRows) {
			return false, false, nil
		}
		return err == nil, ok, err
	}
	exists, ok, err := valid()
	if err != nil {
		return fmt.Errorf("migration 7: %w", err)
	}
	if exists && !ok {
		if _, err := db.ExecContext(ctx, `DROP INDEX CONCURRENTLY holds_by_change`); err != nil {
			return fmt.Errorf("migration 7: drop the invalid index holds_by_change: %w", err)
		}
	}
	if _, err := db.ExecContext(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS holds_by_change ON holds (changed)`); err != nil {
		return fmt.Errorf("migration 7: %w", err)
	}
	if _, ok, err = valid(); err != nil || !ok {
		return fmt.Errorf("migration 7: index holds_by_change is not valid after its build (%v): drop it and start again", err)
	}
	return nil
}
