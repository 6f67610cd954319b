package region

import (
	"context"
	"embed"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate applies the region schema's pending migrations to pool.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	return pgutil.Migrate(ctx, pool, sub)
}
