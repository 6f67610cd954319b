// Package testpg gives each test its own fresh PostgreSQL database on the server named by
// QUOTA_TEST_PG_URL (default postgres://quota:quota@127.0.0.1:5432/postgres), dropped when
// the test ends. `make test` starts the server and creates the role first. There is no
// fallback: a test that needs PostgreSQL fails when it cannot reach it.
package testpg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
)

// DefaultURL is the server tests use when QUOTA_TEST_PG_URL is unset.
const DefaultURL = "postgres://quota:quota@127.0.0.1:5432/postgres"

// AdminURL is the URL of the maintenance database tests create their databases through.
func AdminURL() string {
	if u := os.Getenv("QUOTA_TEST_PG_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// NewDB creates an empty database named quota_t_<prefix>_<random> and returns its URL. It is
// dropped at the end of the test.
func NewDB(t testing.TB, prefix string) string {
	t.Helper()
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := "quota_t_" + prefix + "_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgutil.EnsureDatabase(ctx, AdminURL(), name); err != nil {
		t.Fatalf("testpg: %v (is PostgreSQL running? `make pg` starts it)", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pgutil.DropDatabase(ctx, AdminURL(), name); err != nil {
			t.Logf("testpg: drop %s: %v", name, err)
		}
	})
	u, err := pgutil.WithDatabase(AdminURL(), name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// NewPool creates a fresh database and opens a pool on it, closed at the end of the test.
func NewPool(t testing.TB, prefix string, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	u := NewDB(t, prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgutil.Open(ctx, u, maxConns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, u
}
