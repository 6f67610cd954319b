package region

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

type closeRec struct {
	id, state, payment string
}

type lateRec struct {
	hold, payment, state string
}

type poolDelta struct{ available, held, sold transfer.Units }

// writes are the SQL effects of the decisions taken in memory since the last flush. They are
// written together, a few statements for any number of operations: that is what makes one
// commit serve a whole batch.
type writes struct {
	newHolds []*memHold
	closes   []closeRec
	pools    map[poolKey]*poolDelta
	late     []lateRec
}

func newWrites() *writes {
	return &writes{pools: map[poolKey]*poolDelta{}}
}

func (w *writes) empty() bool {
	return len(w.newHolds) == 0 && len(w.closes) == 0 && len(w.pools) == 0 && len(w.late) == 0
}

func (w *writes) pool(k poolKey) *poolDelta {
	d, ok := w.pools[k]
	if !ok {
		d = &poolDelta{}
		w.pools[k] = d
	}
	return d
}

// flush writes everything decided since the last flush in the caller's transaction. Every
// statement is guarded (a hold closes only from held; counters keep their CHECKs) and must
// change exactly the rows the decisions expect: otherwise memory and the database disagree
// and the batch must not commit.
func (w *writes) flush(ctx context.Context, tx pgx.Tx, now time.Time, stamp int64) error {
	if w.empty() {
		return nil
	}
	b := &pgx.Batch{}
	want := w.queue(b, now, stamp, false)
	if err := execAll(ctx, tx, b, want...); err != nil {
		return fmt.Errorf("flush batch: %w", err)
	}
	*w = *newWrites()
	return nil
}

// execAll sends a batch of statements and checks each one changed exactly the number of
// rows expected. A guard that matches nothing means the writer's decision and the stored
// state disagree: the batch must not commit.
func execAll(ctx context.Context, tx pgx.Tx, b *pgx.Batch, want ...int64) error {
	res := tx.SendBatch(ctx, b)
	for i, w := range want {
		tag, err := res.Exec()
		if err != nil {
			res.Close()
			return fmt.Errorf("statement %d: %w", i, err)
		}
		if w >= 0 && tag.RowsAffected() != w {
			res.Close()
			return fmt.Errorf("statement %d changed %d rows, want %d: guard failed", i, tag.RowsAffected(), w)
		}
	}
	return res.Close()
}

// queue adds the writes' statements to b and returns the rows each must change (-1: any).
// Every hold inserted or closed gets stamp in its changed column (standby.go). With serverGuards the guards are part of the statements (quota_expect fails the one that
// changed another count), for a batch whose commit happens before the client reads a count.
func (w *writes) queue(b *pgx.Batch, now time.Time, stamp int64, serverGuards bool) []int64 {
	var want []int64
	guard := func(sql, what string, n int64, args ...any) {
		if serverGuards {
			sql = fmt.Sprintf("WITH changed AS (%s RETURNING 1) SELECT quota_expect(count(*), $%d, $%d) FROM changed", sql, len(args)+1, len(args)+2)
			args = append(args, n, what)
		}
		b.Queue(sql, args...)
		want = append(want, n)
	}
	if n := len(w.newHolds); n > 0 {
		// No server guard: INSERT ... SELECT FROM unnest of n-element arrays (no ON
		// CONFLICT, no trigger or rule on holds) writes all n rows or fails, and a guard's
		// RETURNING would cost the server a tuple per hold.
		b.Queue(insertHoldsSQL, append(holdColumnsOf(w.newHolds), stamp)...)
		want = append(want, int64(n))
	}
	if n := len(w.closes); n > 0 {
		guard(closeHoldsSQL, "hold closes", int64(n), closeArgs(w.closes, now, stamp)...)
	}
	w.queuePools(guard)

	if n := len(w.late); n > 0 {
		queueLate(b, w.late, now)
		want = append(want, -1) // ON CONFLICT DO NOTHING: a replayed late payment adds no row
	}
	return want
}

// updatePoolSQL moves one pool's counts; updatePoolsSQL moves several pools' counts in one
// statement, from arrays of the pools' keys and deltas (each pool once).
const (
	updatePoolSQL  = `UPDATE pools SET available = available + $3, held = held + $4, sold = sold + $5 WHERE sale_id = $1 AND sku = $2`
	updatePoolsSQL = `UPDATE pools p SET available = p.available + u.a, held = p.held + u.h, sold = p.sold + u.s
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) AS u(sale_id, sku, a, h, s)
		WHERE p.sale_id = u.sale_id AND p.sku = u.sku`
)

// queuePools queues the batch's pool moves: one statement, whatever the pools a batch touches,
// so a batch spread over many pools costs the writer no more round trips than one on a single
// pool. Its guard wants every pool's row changed (I2, I3: each pool's counts move exactly by
// what the batch decided). The arrays go in key order, for a reader of logs; the rows are
// locked in whatever order the plan takes, which cannot deadlock: every batch first locks the
// region's epoch row (the fence), and one writer sends the batches.
func (w *writes) queuePools(guard func(sql, what string, n int64, args ...any)) {
	keys := make([]poolKey, 0, len(w.pools))
	for k := range w.pools {
		keys = append(keys, k)
	}
	switch len(keys) {
	case 0:
		return
	case 1:
		k, d := keys[0], w.pools[keys[0]]
		guard(updatePoolSQL, "pool "+k.sale+"/"+k.sku, 1, k.sale, k.sku, int64(d.available), int64(d.held), int64(d.sold))
		return
	}
	slices.SortFunc(keys, func(a, b poolKey) int { return cmp.Or(cmp.Compare(a.sale, b.sale), cmp.Compare(a.sku, b.sku)) })
	sales, skus := make([]string, len(keys)), make([]string, len(keys))
	avail, held, sold := make([]int64, len(keys)), make([]int64, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		d := w.pools[k]
		sales[i], skus[i], avail[i], held[i], sold[i] = k.sale, k.sku, int64(d.available), int64(d.held), int64(d.sold)
	}
	guard(updatePoolsSQL, fmt.Sprintf("%d pools", len(keys)), int64(len(keys)), sales, skus, avail, held, sold)
}

// flushOnce writes a batch that only in-memory ops decided in one round trip: the epoch
// fence, the writes and their guards go out as one pipeline that PostgreSQL runs as one
// implicit transaction, committed at the pipeline's end or not at all. An error the server
// reports means nothing was committed, except the ones that say the outcome is unknown
// (CockroachDB's 40003, a lost connection, ...): those, and any error that is not the
// server's, return an orphanError naming the backend, which may still run the pipeline.
func (b *batch) flushOnce(ctx context.Context) error {
	if b.w.empty() {
		return nil
	}
	pb := &pgx.Batch{}
	fencing.QueueEpochCheck(pb, b.epoch)
	b.w.queue(pb, b.now, b.stamp, true)
	conn, err := b.db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("flush batch: %w", err) // nothing was sent
	}
	pid := conn.Conn().PgConn().PID()
	started, known := pgutil.BackendStart(conn.Conn().PgConn())
	err = conn.SendBatch(ctx, pb).Close()
	conn.Release()
	if err == nil {
		*b.w = *newWrites()
		return nil
	}
	if fe := fencing.AsFenced(err); fe != nil {
		return fe
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && !outcomeUnknown(pe) {
		return fmt.Errorf("flush batch: %w", err)
	}
	return &orphanError{pid: pid, started: started, startKnown: known, err: err}
}

// outcomeUnknown tells the server errors after which a transaction may have committed.
func outcomeUnknown(pe *pgconn.PgError) bool {
	return pe.Code == "40003" || strings.HasPrefix(pe.Code, "08") || pe.Severity == "FATAL" || pe.Severity == "PANIC"
}

// orphanError is a one-round-trip batch whose outcome is unknown. Its pipeline may not have
// reached its epoch check yet, so the same leader's reload would not wait for it: the
// backend is ended first (endBackend), then the state is read.
type orphanError struct {
	pid        uint32
	started    time.Time // the backend's start, when its pool recorded it (pgutil.BackendStart)
	startKnown bool
	err        error
}

// end ends the orphan's backend (endBackend): by pid and start time when the start is known,
// so that a pid already given to a new backend is left alone.
func (e *orphanError) end(ctx context.Context, db *pgxpool.Pool) error {
	if e.startKnown {
		return endBackendStarted(ctx, db, e.pid, e.started)
	}
	return endBackend(ctx, db, e.pid)
}

// Error says what happened.
func (e *orphanError) Error() string {
	return fmt.Sprintf("%v: flush batch on backend %d: %v", ErrUnknownOutcome, e.pid, e.err)
}

// Unwrap makes errors.Is(err, ErrUnknownOutcome) true.
func (e *orphanError) Unwrap() error { return ErrUnknownOutcome }

// endBackend terminates the backend that has pid now, which may still hold an orphaned
// pipeline, and waits until it is gone, so nothing of that pipeline can commit after the
// caller reads the state. A pid with no backend is already gone.
func endBackend(ctx context.Context, db *pgxpool.Pool, pid uint32) error {
	var started time.Time
	err := db.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = $1 AND backend_start IS NOT NULL`,
		int64(pid)).Scan(&started)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look for backend %d: %w", pid, err)
	}
	return endBackendStarted(ctx, db, pid, started)
}

// endBackendStarted ends the backend with pid that started at started, and waits until it is
// gone. Naming it by its start time too leaves alone a new backend that the server gave the
// same pid once this one exited.
func endBackendStarted(ctx context.Context, db *pgxpool.Pool, pid uint32, started time.Time) error {
	for {
		var alive int
		err := db.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE pid = $1 AND backend_start = $2`, int64(pid), started).Scan(&alive)
		if err != nil {
			return fmt.Errorf("end backend %d: %w", pid, err)
		}
		if alive == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("backend %d still running: %w", pid, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

const insertHoldsSQL = `INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at,
			admission_id, cart_id, changed)
		SELECT id, sale, sku, usr, qty, rkey, rhash, 'held', created, expires, adm, cart, $12::bigint
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::timestamptz[], $9::timestamptz[],
			$10::text[], $11::text[]) AS v(id, sale, sku, usr, qty, rkey, rhash, created, expires, adm, cart)`

func holdColumnsOf(hs []*memHold) []any {
	n := len(hs)
	ids, sales, skus, users, keys, hashes := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	qty := make([]int64, n)
	created, expires, adms, carts := make([]time.Time, n), make([]time.Time, n), make([]string, n), make([]string, n)
	for i, h := range hs {
		ids[i], sales[i], skus[i], users[i], keys[i], hashes[i] = h.ID, h.Sale, h.SKU, h.User, h.RequestKey, hex.EncodeToString(h.hash[:])
		qty[i], created[i], expires[i], adms[i], carts[i] = int64(h.Quantity), h.CreatedAt, h.ExpiresAt, h.Admission, h.CartID
	}
	return []any{ids, sales, skus, users, qty, keys, hashes, created, expires, adms, carts}
}

const closeHoldsSQL = `UPDATE holds h SET state = v.state, payment_id = nullif(v.pay, ''), closed_at = $4, changed = $5::bigint
		FROM unnest($1::text[], $2::text[], $3::text[]) AS v(id, state, pay)
		WHERE h.hold_id = v.id AND h.state = 'held'`

func closeArgs(cs []closeRec, now time.Time, stamp int64) []any {
	ids, states, pays := make([]string, len(cs)), make([]string, len(cs)), make([]string, len(cs))
	for i, c := range cs {
		ids[i], states[i], pays[i] = c.id, c.state, c.payment
	}
	return []any{ids, states, pays, now, stamp}
}

func queueLate(b *pgx.Batch, ls []lateRec, now time.Time) {
	holds, pays, states := make([]string, len(ls)), make([]string, len(ls)), make([]string, len(ls))
	for i, l := range ls {
		holds[i], pays[i], states[i] = l.hold, l.payment, l.state
	}
	b.Queue(`INSERT INTO late_payments (hold_id, payment_id, hold_state, received_at)
		SELECT h, p, s, $4 FROM unnest($1::text[], $2::text[], $3::text[]) AS v(h, p, s)
		ON CONFLICT (hold_id, payment_id) DO NOTHING`, holds, pays, states, now)
}
