package region

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

type closeRec struct {
	id, state, payment string
}

type lateRec struct {
	hold, payment, state string
}

type poolDelta struct{ available, held, sold transfer.Units }

type userDelta struct{ held, bought transfer.Units }

// writes are the SQL effects of the decisions taken in memory since the last flush. They are
// written together, a few statements for any number of operations: that is what makes one
// commit serve a whole batch.
type writes struct {
	newHolds []*memHold
	closes   []closeRec
	pools    map[poolKey]*poolDelta
	users    map[userKey]*userDelta
	late     []lateRec
}

func newWrites() *writes {
	return &writes{pools: map[poolKey]*poolDelta{}, users: map[userKey]*userDelta{}}
}

func (w *writes) empty() bool {
	return len(w.newHolds) == 0 && len(w.closes) == 0 && len(w.pools) == 0 && len(w.users) == 0 && len(w.late) == 0
}

func (w *writes) pool(k poolKey) *poolDelta {
	d, ok := w.pools[k]
	if !ok {
		d = &poolDelta{}
		w.pools[k] = d
	}
	return d
}

func (w *writes) user(k userKey) *userDelta {
	d, ok := w.users[k]
	if !ok {
		d = &userDelta{}
		w.users[k] = d
	}
	return d
}

// flush writes everything decided since the last flush in the caller's transaction. Every
// statement is guarded (a hold closes only from held; counters keep their CHECKs) and must
// change exactly the rows the decisions expect: otherwise memory and the database disagree
// and the batch must not commit.
func (w *writes) flush(ctx context.Context, tx pgx.Tx, now time.Time) error {
	if w.empty() {
		return nil
	}
	b := &pgx.Batch{}
	var want []int64
	if n := len(w.newHolds); n > 0 {
		queueInsertHolds(b, w.newHolds)
		want = append(want, int64(n))
	}
	if n := len(w.closes); n > 0 {
		queueCloses(b, w.closes, now)
		want = append(want, int64(n))
	}
	for k, d := range w.pools {
		b.Queue(`UPDATE pools SET available = available + $3, held = held + $4, sold = sold + $5 WHERE sale_id = $1 AND sku = $2`,
			k.sale, k.sku, int64(d.available), int64(d.held), int64(d.sold))
		want = append(want, 1)
	}
	grow, shrink := splitUsers(w.users)
	if len(grow) > 0 {
		queueUsers(b, grow)
		want = append(want, int64(len(grow)))
	}
	if len(shrink) > 0 {
		queueUserUpdates(b, shrink)
		want = append(want, int64(len(shrink)))
	}
	if n := len(w.late); n > 0 {
		queueLate(b, w.late, now)
		want = append(want, -1) // ON CONFLICT DO NOTHING: a replayed late payment adds no row
	}
	if err := execAll(ctx, tx, b, want...); err != nil {
		return fmt.Errorf("flush batch: %w", err)
	}
	*w = *newWrites()
	return nil
}

func queueInsertHolds(b *pgx.Batch, hs []*memHold) {
	n := len(hs)
	ids, sales, skus, users, keys, hashes := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	qty := make([]int64, n)
	created, expires := make([]time.Time, n), make([]time.Time, n)
	for i, h := range hs {
		ids[i], sales[i], skus[i], users[i], keys[i], hashes[i] = h.ID, h.Sale, h.SKU, h.User, h.RequestKey, hex.EncodeToString(h.hash[:])
		qty[i], created[i], expires[i] = int64(h.Quantity), h.CreatedAt, h.ExpiresAt
	}
	b.Queue(`INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at)
		SELECT id, sale, sku, usr, qty, rkey, rhash, 'held', created, expires
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::timestamptz[], $9::timestamptz[])
			AS v(id, sale, sku, usr, qty, rkey, rhash, created, expires)`,
		ids, sales, skus, users, qty, keys, hashes, created, expires)
}

func queueCloses(b *pgx.Batch, cs []closeRec, now time.Time) {
	ids, states, pays := make([]string, len(cs)), make([]string, len(cs)), make([]string, len(cs))
	for i, c := range cs {
		ids[i], states[i], pays[i] = c.id, c.state, c.payment
	}
	b.Queue(`UPDATE holds h SET state = v.state, payment_id = nullif(v.pay, ''), closed_at = $4
		FROM unnest($1::text[], $2::text[], $3::text[]) AS v(id, state, pay)
		WHERE h.hold_id = v.id AND h.state = 'held'`, ids, states, pays, now)
}

// splitUsers separates deltas that only add (an upsert may create the row) from those that
// take away (the row exists: the user held units before), because PostgreSQL checks an
// upsert's CHECK constraints on the row it would insert.
func splitUsers(us map[userKey]*userDelta) (grow, shrink map[userKey]*userDelta) {
	grow, shrink = map[userKey]*userDelta{}, map[userKey]*userDelta{}
	for k, d := range us {
		if d.held >= 0 && d.bought >= 0 {
			grow[k] = d
		} else {
			shrink[k] = d
		}
	}
	return grow, shrink
}

func queueUserUpdates(b *pgx.Batch, us map[userKey]*userDelta) {
	var sales, skus, users []string
	var held, bought []int64
	for k, d := range us {
		sales, skus, users = append(sales, k.sale), append(skus, k.sku), append(users, k.user)
		held, bought = append(held, int64(d.held)), append(bought, int64(d.bought))
	}
	b.Queue(`UPDATE user_counts u SET held_qty = u.held_qty + v.h, bought_qty = u.bought_qty + v.b
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS v(s, k, usr, h, b)
		WHERE u.sale_id = v.s AND u.sku = v.k AND u.user_id = v.usr`, sales, skus, users, held, bought)
}

func queueUsers(b *pgx.Batch, us map[userKey]*userDelta) {
	var sales, skus, users []string
	var held, bought []int64
	for k, d := range us {
		sales, skus, users = append(sales, k.sale), append(skus, k.sku), append(users, k.user)
		held, bought = append(held, int64(d.held)), append(bought, int64(d.bought))
	}
	b.Queue(`INSERT INTO user_counts (sale_id, sku, user_id, held_qty, bought_qty)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])
		ON CONFLICT (sale_id, sku, user_id) DO UPDATE SET held_qty = user_counts.held_qty + excluded.held_qty,
			bought_qty = user_counts.bought_qty + excluded.bought_qty`, sales, skus, users, held, bought)
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
