package pgutil

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// backendStarts maps each open connection of a pool from Open to its server backend's start
// time. A backend is named by its pid and start time together: the server may give a pid to
// a new backend once the old one exits.
var backendStarts sync.Map // *pgconn.PgConn → time.Time

// recordBackendStart is Open's AfterConnect. A server without pg_stat_activity's
// backend_start (CockroachDB) leaves the connection unrecorded; the connection is used all
// the same.
func recordBackendStart(ctx context.Context, c *pgx.Conn) error {
	var started time.Time
	err := c.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&started)
	if err == nil {
		backendStarts.Store(c.PgConn(), started)
	}
	return nil
}

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
