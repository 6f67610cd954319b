package region

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// StoreBenchHolds writes, for the memory and takeover benchmarks, a sale m with one SKU p
// whose pool holds n units in holds, each of its own user (buyer-<i>, key checkout-1), and
// churn more available: held for an hour, or, with state "sold", sold an hour ago (past
// Config.Sweep.RetainClosed). Exported for the external benchmarks of package region_test.
func StoreBenchHolds(tb testing.TB, pool *pgxpool.Pool, n, churn int, state string) {
	tb.Helper()
	for _, q := range []string{
		`INSERT INTO sales VALUES ('m', ARRAY['p'], 2, 3600000, now())`,
		`INSERT INTO pools VALUES ('m', 'p', $2::bigint, $1::bigint, 0, $1::bigint + $2::bigint, 0)`,
		`INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at)
			SELECT 'us.' || lpad(g::text, 24, '0'), 'm', 'p', 'buyer-' || g, 1, 'checkout-1', md5(g::text), 'held', now(), now() + interval '1 hour'
			FROM generate_series(1, $1) g`,
	} {
		if state == "sold" {
			q = strings.NewReplacer("$1::bigint, 0,", "0, $1::bigint,", "expires_at)", "expires_at, payment_id, closed_at)",
				"'held', now(), now() + interval '1 hour'", "'sold', now(), now() + interval '1 hour', 'pay-' || g, now() - interval '1 hour'").Replace(q)
		}
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, n)
		}
		if strings.Contains(q, "$2") {
			args = append(args, churn)
		}
		if _, err := pool.Exec(context.Background(), q, args...); err != nil {
			tb.Fatal(err)
		}
	}
}
