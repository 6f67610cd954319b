package pgutil

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// closeTimeout bounds closing a listening connection.
const closeTimeout = 5 * time.Second

// Listen subscribes to a PostgreSQL notification channel on a connection of its own, taken
// out of db's pool for as long as it listens and closed when it stops, so no pooled
// connection is ever left listening. It calls ready once the subscription is in place (a
// notification committed after that is delivered; one committed before is not, so a caller
// that must miss nothing reads everything it watches in ready), then got with each
// notification's payload, from this goroutine, in order. It returns ctx's error when ctx
// ends, or the connection's error when the connection fails.
func Listen(ctx context.Context, db *pgxpool.Pool, channel string, ready func(), got func(payload string)) (err error) {
	pc, err := db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", channel, err)
	}
	conn := pc.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if cerr := conn.Close(closeCtx); cerr != nil && ctx.Err() == nil {
			err = errors.Join(err, fmt.Errorf("close the connection listening on %s: %w", channel, cerr))
		}
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen on %s: %w", channel, err)
	}
	ready()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", channel, err)
		}
		got(n.Payload)
	}
}
