package region

import (
	"context"
	"fmt"
	"hash/maphash"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/transfer"
)

// archiveBatch bounds the holds one archiving batch moves, so the writer never pauses long for
// it: about 50 ms a batch of 1,024 over a backlog on a loaded 2-core machine (BenchmarkArchive:
// 20,300 holds/s), against 130 ms for 4,096 (30,800 holds/s).
const archiveBatch = 1024

// archivedBuyer is what the archive holds of one buyer in one sale: per SKU, the holds and the
// units sold, and the request keys of those holds.
type archivedBuyer struct {
	sale, user string
	skus       map[string]archivedCounts
	keys       []string
}

type archivedCounts struct{ holds, sold int64 }

// readBuyers reads the archived rows of each (sale, user) of buyers: their counts in
// archived_users and their keys in holds_closed, both through their primary or unique index.
// A buyer with nothing archived comes back with nothing in it.
func readBuyers(ctx context.Context, q pgxQuerier, buyers []saleUser) (map[saleUser]*archivedBuyer, error) {
	out := make(map[saleUser]*archivedBuyer, len(buyers))
	sales, users := make([]string, len(buyers)), make([]string, len(buyers))
	for i, b := range buyers {
		sales[i], users[i] = b.sale, b.user
		out[b] = &archivedBuyer{sale: b.sale, user: b.user, skus: map[string]archivedCounts{}}
	}
	rows, err := q.Query(ctx, `SELECT a.sale_id, a.user_id, a.sku, a.holds, a.sold FROM archived_users a
		JOIN unnest($1::text[], $2::text[]) AS v(sale, usr) ON a.sale_id = v.sale AND a.user_id = v.usr`, sales, users)
	if err != nil {
		return nil, fmt.Errorf("read archived buyers: %w", err)
	}
	var k saleUser
	var sku string
	var c archivedCounts
	if _, err := pgx.ForEachRow(rows, []any{&k.sale, &k.user, &sku, &c.holds, &c.sold}, func() error {
		if b := out[k]; b != nil {
			b.skus[sku] = c
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read archived buyers: %w", err)
	}
	rows, err = q.Query(ctx, `SELECT c.sale_id, c.user_id, c.request_key FROM holds_closed c
		JOIN unnest($1::text[], $2::text[]) AS v(sale, usr) ON c.sale_id = v.sale AND c.user_id = v.usr`, sales, users)
	if err != nil {
		return nil, fmt.Errorf("read archived keys: %w", err)
	}
	var key string
	if _, err := pgx.ForEachRow(rows, []any{&k.sale, &k.user, &key}, func() error {
		if b := out[k]; b != nil {
			b.keys = append(b.keys, key)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read archived keys: %w", err)
	}
	return out, nil
}

// pgxQuerier is what a multi-row read needs: a pool or a transaction.
type pgxQuerier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// resolve adds a buyer's archived holds to memory: their sold units to the buyer's bought
// ones (and off the pool's archivedSold), their keys to the buyer's keys and to the filter.
// From then on the buyer's counts are whole (I2 is checked against them); a buyer already
// resolved is left as is. Only the writer calls it, under mu.
func (m *memState) resolve(b *archivedBuyer) {
	su := saleUser{b.sale, b.user}
	if m.knowsBuyer(b.sale, b.user) {
		return
	}
	for sku, c := range b.skus {
		uk, pk := userKey{b.sale, sku, b.user}, poolKey{b.sale, sku}
		u := m.users[uk]
		if u == nil {
			u = &memUser{}
			m.users[uk] = u
		}
		u.bought += transfer.Units(c.sold)
		m.archivedSold[pk] -= transfer.Units(c.sold)
		m.keysPer[su] += int32(c.holds)
	}
	for _, k := range b.keys {
		m.retireKey(keyKey{b.sale, b.user, k})
	}
	m.resolved[su] = struct{}{}
}

// dropArchived takes an archived hold out of the state: whole or retired, it leaves holds,
// and its key stays in the filter. Its buyer's counts are unchanged when the buyer is
// resolved (they count archived holds too); otherwise its units and key leave them, to come
// back with the buyer's archived rows (resolve), and its sold units wait in archivedSold. The
// caller holds mu or owns m.
func (m *memState) dropArchived(h *Hold) {
	k := keyKey{h.Sale, h.User, h.RequestKey}
	if old := m.holds[h.ID]; old != nil {
		delete(m.holds, h.ID)
		if m.keys[k] == old {
			delete(m.keys, k)
		}
	}
	m.rows--
	if h.Admission != "" {
		// The ticket has expired (archiveCandidatesSQL): it backs nothing any more.
		d := maphash.Comparable(m.seed, saleAdmission{h.Sale, h.Admission})
		if m.tickets[d] == maphash.String(m.seed, h.RequestKey) {
			delete(m.tickets, d)
		}
	}
	if m.knowsBuyer(h.Sale, h.User) {
		m.retireKey(k)
		return
	}
	m.uncount(&memHold{Hold: *h})
	su := saleUser{h.Sale, h.User}
	if m.keysPer[su]--; m.keysPer[su] <= 0 {
		delete(m.keysPer, su)
	}
	if h.State == Sold {
		m.archivedSold[poolKey{h.Sale, h.SKU}] += h.Quantity
	}
}

// archiveOp moves up to limit holds closed for at least retain from holds to holds_closed
// (archive.go), resolving their buyers first, in the batch's transaction. The holds leave
// memory once the batch commits (writer.commit: dropArchived). I1..I3 are unchanged: no
// pool or buyer count changes, a closed hold only moves; I5: the move is guarded on the hold
// being closed, and a hold is deleted from holds in the same statement that adds it to the
// archive, so it is never lost and never counted twice.
type archiveOp struct {
	region string
	retain time.Duration
	limit  int
}

func (o *archiveOp) apply(ctx context.Context, b *batch) (int, error, error) {
	tx, err := b.sqlOp(ctx)
	if err != nil {
		return 0, nil, err
	}
	cutoff := b.now.Add(-o.retain)
	ids, buyers, err := archiveCandidates(ctx, tx, cutoff, o.limit)
	if err != nil || len(ids) == 0 {
		return 0, nil, err
	}
	if err := b.resolveBuyers(ctx, tx, buyers); err != nil {
		return 0, nil, err
	}
	moved, err := moveToArchive(ctx, tx, o.region, ids, b.stamp)
	if err != nil {
		return 0, nil, err
	}
	if len(moved) != len(ids) {
		return 0, nil, fmt.Errorf("archive: moved %d holds, want %d: guard failed", len(moved), len(ids))
	}
	b.archived = append(b.archived, moved...)
	return len(moved), nil, nil
}

// resolveBuyers resolves, in the batch's transaction, the buyers of holds about to be
// archived whose archived rows are not in memory yet.
func (b *batch) resolveBuyers(ctx context.Context, tx pgx.Tx, buyers []saleUser) error {
	var unknown []saleUser
	for _, su := range buyers {
		if !b.m.knowsBuyer(su.sale, su.user) {
			unknown = append(unknown, su)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	got, err := readBuyers(ctx, tx, unknown)
	if err != nil {
		return err
	}
	b.m.mu.Lock()
	defer b.m.mu.Unlock()
	for _, ab := range got {
		b.m.resolve(ab)
	}
	return nil
}

// archiveCandidatesSQL finds the oldest holds closed at or before $1 (through the partial
// index holds_closed_at). A hold made with an admission ticket waits until the ticket has
// surely expired too (created_at + the sale's ticket TTL, with the retention as a margin for
// the clocks): a leader that loads the state forgets an archived hold's ticket, and a ticket
// backs one request key only while it lives.
const archiveCandidatesSQL = `SELECT h.hold_id, h.sale_id, h.user_id FROM holds h LEFT JOIN sales s ON s.sale_id = h.sale_id
	WHERE h.state <> 'held' AND h.closed_at <= $1
		AND (h.admission_id = '' OR h.created_at <= $1 - coalesce(s.ticket_ttl_ms, 0) * interval '1 millisecond')
	ORDER BY h.closed_at LIMIT $2`

// archiveCandidates reads the ids of up to limit holds to archive, and their buyers.
func archiveCandidates(ctx context.Context, q pgxQuerier, cutoff time.Time, limit int) ([]string, []saleUser, error) {
	rows, err := q.Query(ctx, archiveCandidatesSQL, cutoff, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("find holds to archive: %w", err)
	}
	var ids []string
	seen := map[saleUser]bool{}
	var buyers []saleUser
	var id string
	var su saleUser
	if _, err := pgx.ForEachRow(rows, []any{&id, &su.sale, &su.user}, func() error {
		ids = append(ids, id)
		if !seen[su] {
			seen[su] = true
			buyers = append(buyers, su)
		}
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("find holds to archive: %w", err)
	}
	return ids, buyers, nil
}

// moveToArchiveSQL moves holds $1 (closed ones only) to holds_closed stamped $2, and adds them
// to their buyers' and pools' archived counts, in one statement.
const moveToArchiveSQL = `WITH moved AS (
		DELETE FROM holds WHERE hold_id = ANY($1::text[]) AND state <> 'held'
		RETURNING hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at, closed_at,
			payment_id, admission_id, cart_id, changed),
	ins AS (INSERT INTO holds_closed (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at,
			expires_at, closed_at, payment_id, admission_id, cart_id, changed, archived)
		SELECT hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at, closed_at,
			payment_id, admission_id, cart_id, changed, $2::bigint FROM moved),
	byuser AS (INSERT INTO archived_users AS a (sale_id, user_id, sku, holds, sold)
		SELECT sale_id, user_id, sku, count(*), coalesce(sum(quantity) FILTER (WHERE state = 'sold'), 0) FROM moved
		GROUP BY sale_id, user_id, sku
		ON CONFLICT (sale_id, user_id, sku) DO UPDATE SET holds = a.holds + excluded.holds, sold = a.sold + excluded.sold),
	bypool AS (INSERT INTO archived_pools AS a (sale_id, sku, holds, sold)
		SELECT sale_id, sku, count(*), coalesce(sum(quantity) FILTER (WHERE state = 'sold'), 0) FROM moved GROUP BY sale_id, sku
		ON CONFLICT (sale_id, sku) DO UPDATE SET holds = a.holds + excluded.holds, sold = a.sold + excluded.sold)
	SELECT ` + holdColumns + ` FROM moved`

// moveToArchive runs moveToArchiveSQL and returns the holds it moved.
func moveToArchive(ctx context.Context, tx pgx.Tx, region string, ids []string, stamp int64) ([]Hold, error) {
	rows, err := tx.Query(ctx, moveToArchiveSQL, ids, stamp)
	if err != nil {
		return nil, fmt.Errorf("archive holds: %w", err)
	}
	defer rows.Close()
	moved := make([]Hold, 0, len(ids))
	for rows.Next() {
		h, err := scanHold(rows, region)
		if err != nil {
			return nil, fmt.Errorf("archive holds: %w", err)
		}
		moved = append(moved, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("archive holds: %w", err)
	}
	return moved, nil
}

// archiveDue tells, without the writer, whether a hold is due to be archived: the archiver
// submits nothing, and the writer opens no transaction, while none is.
func archiveDue(ctx context.Context, db *pgxpool.Pool, cutoff time.Time) (bool, error) {
	ids, _, err := archiveCandidates(ctx, db, cutoff, 1)
	return len(ids) > 0, err
}

// archive moves the holds due to the archive, a batch at a time through the writer, until none
// is due or, with a budget, once it has spent it; it returns how many it moved.
func (r *sweeper) archive(ctx context.Context, submit func(context.Context, op[int]) (int, error), budget time.Duration) (int, error) {
	total, start := 0, time.Now()
	for budget <= 0 || time.Since(start) < budget {
		due, err := archiveDue(ctx, r.pool, r.cfg.Clock.Now().Add(-r.cfg.Sweep.RetainClosed))
		if err != nil || !due {
			return total, err
		}
		n, err := submit(ctx, &archiveOp{region: r.cfg.Name, retain: r.cfg.Sweep.RetainClosed, limit: archiveBatch})
		if err != nil {
			return total, err
		}
		total += n
		if n < archiveBatch {
			return total, nil
		}
	}
	return total, nil
}

// ArchiveNow moves every closed hold past the retention to the archive now, and returns how
// many it moved. Tests and operators use it instead of waiting for the sweeper.
func (r *Region) ArchiveNow(ctx context.Context) (int, error) {
	return r.sweeper.archive(ctx, func(ctx context.Context, o op[int]) (int, error) { return submitOp(ctx, r.leadership, o) }, 0)
}

// dropArchivedAll takes a committed batch's archived holds out of the state, under mu.
func (m *memState) dropArchivedAll(hs []Hold) {
	if len(hs) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range hs {
		m.dropArchived(&hs[i])
	}
}
