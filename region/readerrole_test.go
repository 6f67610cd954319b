package region_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
)

// TestReaderRoleCanOnlyRead: after a region's migration, the reader role that
// scripts/pg-setup.sh creates reads every region table and can change none of them.
func TestReaderRoleCanOnlyRead(t *testing.T) {
	ctx := context.Background()
	pool, url := testpg.NewPool(t, "reader", 2)
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, region.ReaderRole).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		t.Fatalf("role %s does not exist: scripts/pg-setup.sh creates it", region.ReaderRole)
	}
	if err := region.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	readerURL := strings.Replace(url, "quota:quota@", region.ReaderRole+":"+region.ReaderRole+"@", 1)
	if readerURL == url {
		t.Fatalf("test database URL %q does not carry the quota role", url)
	}
	reader, err := pgxpool.New(ctx, readerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	for _, table := range []string{"pools", "holds", "transfers_in", "transfers_out", "sales", "sale_fences"} {
		if _, err := reader.Exec(ctx, `SELECT count(*) FROM `+table); err != nil {
			t.Errorf("reader cannot read %s: %v", table, err)
		}
		if _, err := reader.Exec(ctx, `DELETE FROM `+table); err == nil {
			t.Errorf("reader could delete from %s", table)
		}
	}
	if _, err := reader.Exec(ctx, `UPDATE pools SET available = available + 1`); err == nil {
		t.Error("reader could update pools")
	}
	if err := pgutil.GrantRead(ctx, pool, "no-such; DROP"); err == nil {
		t.Error("GrantRead took a role name that is not an identifier")
	}
}
