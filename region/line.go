package region

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
)

// The line is durable: every entry of a waiting room or a waitlist is written to
// line_entries (migration 00013) before the buyer hears of it, and every admission or offer
// before it is shown, so a leader taking over rebuilds the lines as they were (loadLines).
// The writes go through the lineWriter, which batches them as the region's writer batches
// holds: whatever is queued goes out in one pipeline (the epoch fence, one INSERT, one
// UPDATE), which PostgreSQL runs as one implicit transaction. A buyer's place is taken in
// memory only once its row committed (admission.Room.Arrive, then Settle), in the order the
// rows were numbered, so the order a new leader reads (seq) is the order this one served.

// Line entry states as stored (line_entries.state).
const (
	lineQueued    = "queued"
	lineAdmitted  = "admitted"
	lineElsewhere = "elsewhere"
)

// lineRow is one entry's row (insert), or the change of one (update: sale, id, state,
// expires, units, region).
type lineRow struct {
	sale, id, user, sku string
	pre                 bool
	state               string
	expires             time.Time
	units               int64
	region              string
	at                  time.Time
}

// lineReq is one row to write under epoch. settle runs on the writer's goroutine once the
// row's batch is done, in the order the requests were queued, with nil when the row
// committed: it takes the entry's place in memory or lets it go. done is closed after it.
type lineReq struct {
	epoch  int64
	insert bool
	row    lineRow
	settle func(err error)
	err    error
	done   chan struct{}
}

// lineWriter is a Door's writer of line entries: one goroutine, owned by the Door, from
// start to close.
type lineWriter struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
	in     chan *lineReq
	max    int
	// seq is the last seq given out; the load of a term sets it above the stored ones.
	seq  int64
	stop chan struct{}
	done chan struct{}
	once sync.Once
	gate sync.RWMutex // held shared while queuing, exclusively by close
	shut bool
	mu   sync.Mutex // guards seq
	// timeout bounds one batch's round trip, undoTimeout the undoing of one whose outcome
	// is unknown (lineWriteTimeout and lineUndoTimeout; tests shorten them).
	timeout, undoTimeout time.Duration
	// lost runs on the writer's goroutine when a batch of term epoch may have committed and
	// could not be undone: memory and the rows may disagree, so the term ends (the Door steps
	// the region down: a new term reloads the line behind the epoch fence).
	lost func(epoch int64)
}

// Bounds of the line writer: rows per batch, and rows waiting.
const (
	lineMaxBatch = 1024
	lineMaxQueue = 16 * lineMaxBatch
	// lineWriteTimeout bounds one batch's round trip, lineUndoTimeout the undoing of one
	// whose outcome is unknown.
	lineWriteTimeout = 10 * time.Second
	lineUndoTimeout  = 10 * time.Second
)

// newLineWriter starts a writer of line entries to pool; lost is its lineWriter.lost.
func newLineWriter(pool *pgxpool.Pool, logger *slog.Logger, lost func(epoch int64)) *lineWriter {
	lw := &lineWriter{pool: pool, logger: logger, in: make(chan *lineReq, lineMaxQueue), max: lineMaxBatch,
		stop: make(chan struct{}), done: make(chan struct{}), timeout: lineWriteTimeout, undoTimeout: lineUndoTimeout, lost: lost}
	go lw.run()
	return lw
}

// close stops the writer and fails (settles) every request still queued; idempotent.
func (lw *lineWriter) close() {
	lw.once.Do(func() { close(lw.stop) })
	<-lw.done
	lw.gate.Lock()
	lw.shut = true
	lw.gate.Unlock()
	lw.failQueued()
}

// setSeq makes the next rows' seq rise above last (a term's load read it).
func (lw *lineWriter) setSeq(last int64) {
	lw.mu.Lock()
	lw.seq = max(lw.seq, last)
	lw.mu.Unlock()
}

// record queues req and waits for its batch. The request is settled whatever happens to the
// caller: when ctx ends first, the answer is UNKNOWN_OUTCOME and settle runs later.
func (lw *lineWriter) record(ctx context.Context, req *lineReq) error {
	req.done = make(chan struct{})
	if err := lw.enqueue(req); err != nil {
		req.settle(err)
		return err
	}
	select {
	case <-req.done:
		return req.err
	case <-ctx.Done():
		return fmt.Errorf("%w (%v)", ErrUnknownOutcome, ctx.Err())
	}
}

// recordAll is record for several requests at once, which share batches: it answers the first
// error among them.
func (lw *lineWriter) recordAll(ctx context.Context, reqs []*lineReq) error {
	var first error
	var queued []*lineReq
	for _, req := range reqs {
		req.done = make(chan struct{})
		if err := lw.enqueue(req); err != nil {
			req.settle(err)
			first = cmp.Or(first, err)
			continue
		}
		queued = append(queued, req)
	}
	for _, req := range queued {
		select {
		case <-req.done:
			first = cmp.Or(first, req.err)
		case <-ctx.Done():
			return fmt.Errorf("%w (%v)", ErrUnknownOutcome, ctx.Err())
		}
	}
	return first
}

func (lw *lineWriter) enqueue(req *lineReq) error {
	lw.gate.RLock()
	defer lw.gate.RUnlock()
	if lw.shut {
		return fmt.Errorf("the line's writer stopped: %w", ErrNotLeader)
	}
	select {
	case lw.in <- req:
		return nil
	default:
		return &apierr.OverloadedError{What: "the waiting room's writer queue", RetryAfter: queueRetryAfter}
	}
}

func (lw *lineWriter) run() {
	defer close(lw.done)
	for {
		var first *lineReq
		select {
		case <-lw.stop:
			return
		case first = <-lw.in:
		}
		batch := []*lineReq{first}
	collect:
		for len(batch) < lw.max {
			select {
			case r := <-lw.in:
				batch = append(batch, r)
			default:
				break collect
			}
		}
		for len(batch) > 0 { // one epoch per pipeline
			n := 1
			for n < len(batch) && batch[n].epoch == batch[0].epoch {
				n++
			}
			lw.commit(batch[:n])
			batch = batch[n:]
		}
	}
}

func (lw *lineWriter) failQueued() {
	for {
		select {
		case r := <-lw.in:
			lw.answer(r, fmt.Errorf("the line's writer stopped: %w", ErrNotLeader))
		default:
			return
		}
	}
}

func (lw *lineWriter) answer(r *lineReq, err error) {
	r.err = err
	r.settle(err)
	close(r.done)
}

// commit writes reqs (one epoch) and settles each, in order: the inserts with insErr, the
// updates with upErr.
func (lw *lineWriter) commit(reqs []*lineReq) {
	ctx, cancel := context.WithTimeout(context.Background(), lw.timeout)
	insErr, upErr := lw.write(ctx, reqs)
	cancel()
	for _, r := range reqs {
		if r.insert {
			lw.answer(r, insErr)
		} else {
			lw.answer(r, upErr)
		}
	}
}

// write sends one pipeline for reqs: the epoch fence, the inserts (numbered here, in order)
// and the updates, each update guarded to change its row. It answers what the inserts and
// the updates are told: the same error, but for a failure whose outcome is unknown (the
// deadline passed, or the connection was lost mid-commit), which settleUnknown settles.
func (lw *lineWriter) write(ctx context.Context, reqs []*lineReq) (insErr, upErr error) {
	var ins, ups []lineRow
	for _, r := range reqs {
		if r.insert {
			ins = append(ins, r.row)
		} else {
			ups = append(ups, r.row)
		}
	}
	lw.mu.Lock()
	first := lw.seq + 1
	lw.seq += int64(len(ins)) // given out even if the batch fails: a seq is never reused
	lw.mu.Unlock()
	pb := &pgx.Batch{}
	fencing.QueueEpochCheck(pb, reqs[0].epoch)
	if len(ins) > 0 {
		pb.Queue(insertLineSQL, insertLineArgs(ins, first)...)
	}
	if len(ups) > 0 {
		pb.Queue(updateLineSQL, updateLineArgs(ups)...)
	}
	conn, err := lw.pool.Acquire(ctx)
	if err != nil {
		err = fmt.Errorf("%w: write the line: %v", ErrAborted, err)
		return err, err
	}
	pid := conn.Conn().PgConn().PID()
	started, known := pgutil.BackendStart(conn.Conn().PgConn())
	err = conn.SendBatch(ctx, pb).Close()
	conn.Release()
	if err == nil {
		return nil, nil
	}
	if fe := fencing.AsFenced(err); fe != nil {
		err = fmt.Errorf("write the line: %v: %w", fe, ErrNotLeader)
		return err, err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && !outcomeUnknown(pe) {
		err = fmt.Errorf("%w: write the line: %v", ErrAborted, err)
		return err, err
	}
	return lw.settleUnknown(&orphanError{pid: pid, started: started, startKnown: known, err: err}, reqs[0].epoch, ins)
}

// settleUnknown settles a batch whose outcome is unknown, under a context of its own (the
// batch's deadline passing is the usual cause): it ends the batch's backend, so nothing of
// it commits later, and deletes the rows it may have inserted, so no row a buyer never heard
// of stays in the line: the inserts surely did not happen (ABORTED). The updates may have
// committed and are not undone (UNKNOWN_OUTCOME; their callers write them again). When the
// undoing fails, every request's outcome stays unknown and lost ends the term.
func (lw *lineWriter) settleUnknown(orphan *orphanError, epoch int64, ins []lineRow) (insErr, upErr error) {
	ctx, cancel := context.WithTimeout(context.Background(), lw.undoTimeout)
	defer cancel()
	if err := lw.undo(ctx, orphan, epoch, ins); err != nil {
		lw.logger.Error("a line batch's outcome is unknown and could not be undone; the term ends", "epoch", epoch,
			"err", orphan.err, "undo", err)
		if lw.lost != nil {
			lw.lost(epoch)
		}
		return orphan, orphan
	}
	return fmt.Errorf("%w: write the line: %v (undone)", ErrAborted, orphan.err), fmt.Errorf("write the line: %w", orphan)
}

// undo ends an orphaned batch's backend, then deletes the rows it may have inserted.
func (lw *lineWriter) undo(ctx context.Context, orphan *orphanError, epoch int64, ins []lineRow) error {
	if err := orphan.end(ctx, lw.pool); err != nil {
		return err
	}
	if len(ins) == 0 {
		return nil
	}
	sales, ids := make([]string, len(ins)), make([]string, len(ins))
	for i, r := range ins {
		sales[i], ids[i] = r.sale, r.id
	}
	pb := &pgx.Batch{}
	fencing.QueueEpochCheck(pb, epoch)
	pb.Queue(`DELETE FROM line_entries l USING unnest($1::text[], $2::text[]) AS v(sale, id)
		WHERE l.sale_id = v.sale AND l.admission_id = v.id`, sales, ids)
	return lw.pool.SendBatch(ctx, pb).Close()
}

const insertLineSQL = `INSERT INTO line_entries (sale_id, admission_id, user_id, sku, seq, pre, entered_at)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bool[], $7::timestamptz[])`

func insertLineArgs(rs []lineRow, first int64) []any {
	n := len(rs)
	sales, ids, users, skus := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	seqs, pres, ats := make([]int64, n), make([]bool, n), make([]time.Time, n)
	for i, r := range rs {
		sales[i], ids[i], users[i], skus[i] = r.sale, r.id, r.user, r.sku
		seqs[i], pres[i], ats[i] = first+int64(i), r.pre, r.at
	}
	return []any{sales, ids, users, skus, seqs, pres, ats}
}

// updateLineSQL changes entries' states, and fails (quota_expect) unless it changed every
// row it names: memory and the table must not disagree.
const updateLineSQL = `WITH changed AS (UPDATE line_entries l SET state = v.state,
		expires_at = CASE WHEN v.state = 'admitted' THEN v.expires END, units = v.units, bound_region = v.region
	FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::bigint[], $6::text[]) AS v(sale, id, state, expires, units, region)
	WHERE l.sale_id = v.sale AND l.admission_id = v.id RETURNING 1)
	SELECT quota_expect(count(*), $7, 'line entries') FROM changed`

func updateLineArgs(rs []lineRow) []any {
	n := len(rs)
	sales, ids, states, regions := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	expires, units := make([]time.Time, n), make([]int64, n)
	for i, r := range rs {
		sales[i], ids[i], states[i], regions[i] = r.sale, r.id, r.state, r.region
		expires[i], units[i] = r.expires, r.units
	}
	return []any{sales, ids, states, expires, units, regions, int64(n)}
}
