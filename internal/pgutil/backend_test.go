package pgutil_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
)

// TestBackendStartIsRecorded: every connection of a pool from Open knows its backend's start
// time, the one the server reports, and forgets it once the pool closes the connection.
func TestBackendStartIsRecorded(t *testing.T) {
	ctx := context.Background()
	pool, _ := testpg.NewPool(t, "pgutil", 2)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pc := conn.Conn().PgConn()
	got, ok := pgutil.BackendStart(pc)
	var want time.Time
	if err := conn.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if !ok || !got.Equal(want) {
		t.Fatalf("recorded start %v (known %v); the server says %v", got, ok, want)
	}
	conn.Release()
	pool.Close()
	if _, ok := pgutil.BackendStart(pc); ok {
		t.Fatal("a closed connection's start is still recorded")
	}
}
