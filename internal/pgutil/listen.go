package pgutil

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// closeTimeout bounds closing a listening connection.
const closeTimeout = 5 * time.Second

// listenHeartbeat is how long a listening connection may be quiet before it must answer a
// query, and how long it has to answer.
var listenHeartbeat = 10 * time.Second

// Listen subscribes to a PostgreSQL notification channel on a connection of its own, taken
// out of db's pool for as long as it listens and closed when it stops, so no pooled
// connection is ever left listening. It calls ready once the subscription is in place (a
// notification committed after that is delivered; one committed before is not, so a caller
// that must miss nothing reads everything it watches in ready), then got with each
// notification's payload, from this goroutine, in order. A connection quiet for
// listenHeartbeat must answer a query, so one that died without a word is found. It returns
// ctx's error when ctx ends, or the connection's error when the connection fails.
func Listen(ctx context.Context, db *pgxpool.Pool, channel string, ready func(), got func(payload string)) (err error) {
	pc, err := db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", channel, err)
	}
	conn := pc.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		forgetBackendStart(conn) // the pool's BeforeClose, which would, never sees it
		if cerr := conn.Close(closeCtx); cerr != nil && ctx.Err() == nil {
			err = errors.Join(err, fmt.Errorf("close the connection listening on %s: %w", channel, cerr))
		}
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen on %s: %w", channel, err)
	}
	ready()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenHeartbeat)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			got(n.Payload)
			continue
		case ctx.Err() != nil:
			return fmt.Errorf("listen on %s: %w", channel, ctx.Err())
		case !errors.Is(err, context.DeadlineExceeded) && !pgconn.Timeout(err):
			return fmt.Errorf("listen on %s: %w", channel, err)
		}
		// Quiet for a heartbeat: a connection that died without a word (a partition, a
		// failed-over server) would wait for ever, so it must answer a query.
		pctx, cancel := context.WithTimeout(ctx, listenHeartbeat)
		_, err = conn.Exec(pctx, "SELECT 1")
		cancel()
		if err != nil {
			return fmt.Errorf("listen on %s: the connection did not answer: %w", channel, err)
		}
	}
}
