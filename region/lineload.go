package region

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// storedLine is every line entry stored at the region, read in one snapshot at the start of
// a term: per sale, the room's entries, and per SKU the waitlist's, each in seq order.
type storedLine struct {
	rooms     map[string][]admission.Stored
	waitlists map[poolKey][]admission.Stored
	lastSeq   int64
	rows      int
}

// loadLineSQL reads every entry in the order it was recorded. An admission that backs a hold
// (holds.admission_id, through holds_admission) was used: the hold's commit is its record.
const loadLineSQL = `SELECT l.sale_id, l.admission_id, l.user_id, l.sku, l.pre, l.state, l.expires_at, l.units, l.bound_region, l.seq,
		EXISTS (SELECT 1 FROM holds h WHERE h.sale_id = l.sale_id AND h.admission_id = l.admission_id)
	FROM line_entries l ORDER BY l.seq`

// readLine reads the stored lines in one snapshot.
func readLine(ctx context.Context, tx pgx.Tx) (*storedLine, error) {
	out := &storedLine{rooms: map[string][]admission.Stored{}, waitlists: map[poolKey][]admission.Stored{}}
	rows, err := tx.Query(ctx, loadLineSQL)
	if err != nil {
		return nil, fmt.Errorf("read the line: %w", err)
	}
	var sale, sku, state string
	var s admission.Stored
	var expires pgtype.Timestamptz
	var units, seq int64
	var used bool
	_, err = pgx.ForEachRow(rows, []any{&sale, &s.ID, &s.User, &sku, &s.Pre, &state, &expires, &units, &s.Region, &seq, &used}, func() error {
		s.Units, s.ExpiresAt = int(units), expires.Time
		switch {
		case state == lineQueued:
			s.State = admission.Queued
		case state == lineElsewhere:
			s.State = admission.Elsewhere
		case used:
			s.State = admission.Used
		default:
			s.State = admission.Admitted
		}
		if sku == "" {
			out.rooms[sale] = append(out.rooms[sale], s)
		} else {
			out.waitlists[poolKey{sale, sku}] = append(out.waitlists[poolKey{sale, sku}], s)
		}
		out.lastSeq = max(out.lastSeq, seq)
		out.rows++
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the line: %w", err)
	}
	return out, nil
}

// loadTimeout bounds a term's load of the line.
const loadTimeout = 30 * time.Second

// ensureLoaded makes sure the lines of the current term are in memory, and answers the term's
// epoch: the first caller in a term (the admitting loop, at once after a takeover) reads them
// (loadLine); the others wait for it. NOT_LEADER when this process does not lead.
func (d *Door) ensureLoaded(ctx context.Context) (int64, error) {
	epoch, ok := d.r.term()
	if !ok {
		return 0, d.r.notLeader()
	}
	d.mu.Lock()
	loaded := d.epoch == epoch
	d.mu.Unlock()
	if loaded {
		return epoch, nil
	}
	d.loadMu.Lock()
	defer d.loadMu.Unlock()
	d.mu.Lock()
	loaded = d.epoch == epoch
	d.mu.Unlock()
	if loaded {
		return epoch, nil
	}
	lctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	if err := d.loadLine(lctx, epoch); err != nil {
		return 0, fmt.Errorf("%w: load the waiting rooms: %v", ErrAborted, err)
	}
	return epoch, nil
}

// loadLine reads the stored lines and makes the rooms and waitlists of term epoch from them,
// replacing those of any earlier term. The waitlists' outstanding offers set their units
// aside again.
func (d *Door) loadLine(ctx context.Context, epoch int64) error {
	start := time.Now()
	var st *storedLine
	err := pgutil.ReadTx(ctx, d.r.pool, func(tx pgx.Tx) (err error) {
		st, err = readLine(ctx, tx)
		return err
	})
	if err != nil {
		return err
	}
	d.line.setSeq(st.lastSeq)
	now := d.r.cfg.Clock.Now()
	rooms, lists := map[string]*saleRoom{}, map[poolKey]*saleWaitlist{}
	for sale, entries := range st.rooms {
		sr, err := d.newRoom(ctx, sale, epoch)
		if err != nil {
			return err
		}
		if sr == nil {
			continue // the sale has no waiting room any more
		}
		if err := sr.room.Restore(entries, now); err != nil {
			return fmt.Errorf("sale %s: restore the waiting room: %w", sale, err)
		}
		rooms[sale] = sr
	}
	for pk, entries := range st.waitlists {
		wl, err := d.restoreWaitlist(ctx, pk, epoch, entries, now)
		if err != nil {
			return err
		}
		lists[pk] = wl
	}
	d.install(epoch, rooms, lists)
	d.cfg.Logger.Info("waiting rooms loaded", "region", d.r.cfg.Name, "epoch", epoch, "rooms", len(rooms), "waitlists", len(lists),
		"entries", st.rows, "load_ms", time.Since(start).Milliseconds())
	return nil
}

// restoreWaitlist makes pk's waitlist of term epoch from its stored entries.
func (d *Door) restoreWaitlist(ctx context.Context, pk poolKey, epoch int64, entries []admission.Stored, now time.Time) (*saleWaitlist, error) {
	t, err := d.r.terms(ctx, pk.sale)
	if err != nil {
		return nil, fmt.Errorf("sale %s: %w", pk.sale, err)
	}
	wl, err := newSaleWaitlist(d.r.cfg.Name, t, pk.sku, epoch)
	if err != nil {
		return nil, err
	}
	if err := wl.list.Restore(entries, now); err != nil {
		return nil, fmt.Errorf("sale %s sku %s: restore the waitlist: %w", pk.sale, pk.sku, err)
	}
	return wl, nil
}

// install makes rooms and lists the door's, for term epoch; the outstanding offers' units
// are set aside again, and how many buyers wait is known to the writer.
func (d *Door) install(epoch int64, rooms map[string]*saleRoom, lists map[poolKey]*saleWaitlist) {
	d.mu.Lock()
	d.rooms, d.offers.lists, d.epoch = rooms, lists, epoch
	d.mu.Unlock()
	for pk, wl := range lists {
		d.r.aside.add(pk, transfer.Units(wl.list.SetAside()))
		d.r.aside.setWaiting(pk, wl.list.Len())
	}
}

// pruneEvery is how often the leader deletes ended line entries; pruneBatch bounds one
// statement's rows.
const (
	pruneEvery = 30 * time.Second
	pruneBatch = 4096
)

// pruneLineSQL deletes up to $3 entries that ended before their retention: admissions whose
// ticket expired 2 × the sale's ticket TTL ago (offers: 2 × $2 ago), and buyers bound
// elsewhere as long ago. A pre-queue entry stays while any of its sale's pre-queue is still
// queued: a new leader draws the pre-queue again from all of it.
const pruneLineSQL = `DELETE FROM line_entries WHERE ctid = ANY(ARRAY(
	SELECT l.ctid FROM line_entries l JOIN sales s ON s.sale_id = l.sale_id
	WHERE ((l.state = 'admitted' AND l.expires_at < $1::timestamptz - CASE WHEN l.sku = '' THEN 2 * s.ticket_ttl_ms * interval '1 millisecond'
				ELSE 2 * $2::bigint * interval '1 millisecond' END)
			OR (l.state = 'elsewhere' AND l.entered_at < $1::timestamptz - 2 * s.ticket_ttl_ms * interval '1 millisecond'))
		AND (NOT l.pre OR NOT EXISTS (SELECT 1 FROM line_entries q WHERE q.sale_id = l.sale_id AND q.sku = '' AND q.pre AND q.state = 'queued'))
	LIMIT $3))`

// prune deletes the ended entries past their retention, a bounded batch at a time, under the
// epoch fence; it answers how many it deleted.
func (d *Door) prune(ctx context.Context, epoch int64, now time.Time) (int64, error) {
	var total int64
	for range 64 { // at most 64 batches a round: the rest waits for the next
		pb := &pgx.Batch{}
		fencing.QueueEpochCheck(pb, epoch)
		pb.Queue(pruneLineSQL, now, admission.DefaultOfferTTL.Milliseconds(), pruneBatch)
		res := d.r.pool.SendBatch(ctx, pb)
		_, err := res.Exec()
		if err == nil {
			var tag pgconn.CommandTag
			tag, err = res.Exec()
			total += tag.RowsAffected()
			if err == nil && tag.RowsAffected() < pruneBatch {
				return total, res.Close()
			}
		}
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return total, fmt.Errorf("prune the line: %w", err)
		}
	}
	return total, nil
}
