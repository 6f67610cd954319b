package pgutil

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// backendStarts maps each open connection of a pool from Open to its server backend's start
// time. A backend is named by its pid and start time together: the server may give a pid to
// a new backend once the old one exits.
var backendStarts sync.Map // *pgconn.PgConn → time.Time

// recordBackendStart is Open's AfterConnect. A server that answers without a start
// (CockroachDB: no such row or column) leaves the connection unrecorded, used all the same.
// A server that does not answer within backendStartWait fails the connection: the pool
// drops it rather than hand out one that is already broken.
func recordBackendStart(ctx context.Context, c *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, backendStartWait)
	defer cancel()
	var started time.Time
	err := c.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&started)
	var pe *pgconn.PgError
	switch {
	case err == nil:
		backendStarts.Store(c.PgConn(), started)
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pe):
	default:
		return fmt.Errorf("read the backend's start: %w", err)
	}
	return nil
}

// backendStartWait bounds recordBackendStart's query.
const backendStartWait = 5 * time.Second

// forgetBackendStart is Open's BeforeClose.
func forgetBackendStart(c *pgx.Conn) { backendStarts.Delete(c.PgConn()) }

// BackendStart returns when the backend serving c started, as the server recorded it when c
// connected (c from a pool of Open), or false when it is unknown.
func BackendStart(c *pgconn.PgConn) (time.Time, bool) {
	v, ok := backendStarts.Load(c)
	if !ok {
		return time.Time{}, false
	}
	return v.(time.Time), true
}
