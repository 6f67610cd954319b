package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// sqlSchema is every SQL variant's database: the stock split over rows (one row for (a) and
// (b), K for (c)) and one row per hold.
const sqlSchema = `
CREATE TABLE stock (id int PRIMARY KEY, available bigint NOT NULL CHECK (available >= 0));
CREATE TABLE holds (id bigserial PRIMARY KEY, bucket int NOT NULL, user_id text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now());`

// sqlVariant is one of (a), (b) or (c) with one K.
type sqlVariant struct {
	name    string // a, b, c<K>
	label   string
	kind    string // VariantForUpdate, VariantConditional or VariantBuckets
	buckets int    // stock rows
}

func (c *Config) sqlVariants() []sqlVariant {
	var vs []sqlVariant
	if c.wants(VariantForUpdate) {
		vs = append(vs, sqlVariant{name: VariantForUpdate, label: "SQL 1 row: SELECT FOR UPDATE + UPDATE + hold INSERT", kind: VariantForUpdate, buckets: 1})
	}
	if c.wants(VariantConditional) {
		vs = append(vs, sqlVariant{name: VariantConditional, label: "SQL 1 row: conditional UPDATE RETURNING + hold INSERT", kind: VariantConditional, buckets: 1})
	}
	if c.wants(VariantBuckets) {
		for _, k := range c.Buckets {
			vs = append(vs, sqlVariant{name: VariantBuckets + strconv.Itoa(k), kind: VariantBuckets, buckets: k,
				label: fmt.Sprintf("SQL %d bucket rows: random start, roll over + hold INSERT", k)})
		}
	}
	return vs
}

// errNoStock ends a transaction that found no stock; it is rolled back and counted as a
// refusal.
var errNoStock = errors.New("no stock left")

// runSQL runs one SQL variant in its own fresh database and checks its books.
func runSQL(ctx context.Context, cfg *Config, dbs *databases, v sqlVariant) (VariantResult, error) {
	cfg.progress("(%s) %s: preparing database", v.name, v.label)
	pool, err := openSQL(ctx, cfg, dbs, v)
	if err != nil {
		return VariantResult{}, err
	}
	defer pool.Close()
	cfg.progress("(%s) running", v.name)
	res := cfg.stockLoad(func(w int) attempt { return v.attempt(pool, cfg.Seed, w) }).run(ctx)
	res.Variant, res.Label, res.Stock = v.name, v.label, cfg.Stock
	if v.kind == VariantBuckets {
		res.Buckets = v.buckets
	}
	var holds, remaining int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM holds), (SELECT coalesce(sum(available), 0) FROM stock)`).
		Scan(&holds, &remaining); err != nil {
		return res, fmt.Errorf("count holds: %w", err)
	}
	res.HoldRows, res.Remaining = holds, transfer.Units(remaining)
	res.checkUnits(true)
	return res, nil
}

// openSQL creates the variant's database and schema, puts the stock in, and opens a pool
// with every connection already established.
func openSQL(ctx context.Context, cfg *Config, dbs *databases, v sqlVariant) (*pgxpool.Pool, error) {
	url, err := dbs.create(ctx, cfg.DBPrefix+"_"+v.name)
	if err != nil {
		return nil, err
	}
	pool, err := pgutil.Open(ctx, url, int32(cfg.SQLConns))
	if err != nil {
		return nil, err
	}
	if err := seedStock(ctx, pool, cfg.Stock, v.buckets); err != nil {
		pool.Close()
		return nil, err
	}
	if err := warmPool(ctx, pool, cfg.SQLConns); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// seedStock creates the tables and splits stock evenly over rows 0..buckets-1 (the first
// stock % buckets rows get one unit more).
func seedStock(ctx context.Context, pool *pgxpool.Pool, stock transfer.Units, buckets int) error {
	if _, err := pool.Exec(ctx, sqlSchema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	parts := make([]int64, buckets)
	for i := range parts {
		parts[i] = int64(stock) / int64(buckets)
		if int64(i) < int64(stock)%int64(buckets) {
			parts[i]++
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO stock (id, available)
		SELECT i - 1, a FROM unnest($1::bigint[]) WITH ORDINALITY AS t(a, i)`, parts); err != nil {
		return fmt.Errorf("insert stock: %w", err)
	}
	_, err := pool.Exec(ctx, `ANALYZE stock`)
	return err
}

// warmPool opens all n connections of pool at once, so no variant pays for connecting.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("open connections: %w", err)
		}
		conns = append(conns, c)
		if err := c.Ping(ctx); err != nil {
			return err
		}
	}
	return nil
}

// attempt builds worker w's reservation function for the variant.
func (v sqlVariant) attempt(pool *pgxpool.Pool, seed uint64, w int) attempt {
	var body func(ctx context.Context, tx pgx.Tx, user string) error
	switch v.kind {
	case VariantForUpdate:
		body = forUpdate
	case VariantConditional:
		body = func(ctx context.Context, tx pgx.Tx, user string) error { return takeOrFail(ctx, tx, 0, user) }
	default:
		body = rollover(v.buckets, rand.New(rand.NewPCG(seed, uint64(v.buckets)<<32|uint64(w))))
	}
	prefix := "u" + strconv.FormatUint(seed, 10) + "-"
	return func(ctx context.Context, n int64) (outcome, error) {
		user := prefix + strconv.FormatInt(n, 10)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return body(ctx, tx, user) })
		switch {
		case err == nil:
			return took, nil
		case errors.Is(err, errNoStock):
			return refused, nil
		default:
			return failed, err
		}
	}
}

// forUpdate is (a): lock the row, decide in the client, update it, insert the hold.
func forUpdate(ctx context.Context, tx pgx.Tx, user string) error {
	var avail int64
	if err := tx.QueryRow(ctx, `SELECT available FROM stock WHERE id = 0 FOR UPDATE`).Scan(&avail); err != nil {
		return err
	}
	if avail < 1 {
		return errNoStock
	}
	if _, err := tx.Exec(ctx, `UPDATE stock SET available = available - 1 WHERE id = 0`); err != nil {
		return err
	}
	return insertHold(ctx, tx, 0, user)
}

// takeOrFail is (b): one conditional decrement of row 0, then the hold.
func takeOrFail(ctx context.Context, tx pgx.Tx, bucket int, user string) error {
	ok, err := take(ctx, tx, bucket)
	if err != nil {
		return err
	}
	if !ok {
		return errNoStock
	}
	return insertHold(ctx, tx, bucket, user)
}

// rollover is (c): from a random bucket, try each bucket in turn until one gives a unit.
// A bucket once seen empty stays empty (stock only goes down), so the worker skips it from
// then on; when every bucket was seen empty, the stock is gone.
func rollover(k int, rng *rand.Rand) func(ctx context.Context, tx pgx.Tx, user string) error {
	empty := make([]bool, k)
	return func(ctx context.Context, tx pgx.Tx, user string) error {
		start := rng.IntN(k)
		for i := range k {
			b := (start + i) % k
			if empty[b] {
				continue
			}
			ok, err := take(ctx, tx, b)
			if err != nil {
				return err
			}
			if ok {
				return insertHold(ctx, tx, b, user)
			}
			empty[b] = true
		}
		return errNoStock
	}
}

// take decrements bucket by one if it has a unit left, and says whether it did.
func take(ctx context.Context, tx pgx.Tx, bucket int) (bool, error) {
	var left int64
	err := tx.QueryRow(ctx, `UPDATE stock SET available = available - 1 WHERE id = $1 AND available >= 1 RETURNING available`,
		bucket).Scan(&left)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func insertHold(ctx context.Context, tx pgx.Tx, bucket int, user string) error {
	_, err := tx.Exec(ctx, `INSERT INTO holds (bucket, user_id) VALUES ($1, $2)`, bucket, user)
	return err
}
