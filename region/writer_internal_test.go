package region

// White-box tests of the writer's failure handling: a batch is one transaction, and when it
// does not commit, no request in it may be answered as a success and the cache must not run
// ahead of the database (docs/architecture.md, "The region leader's memory"; I6).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/transfer"
)

// execOp runs one SQL statement in the batch; a statement error is fatal to the batch.
type execOp struct{ sql string }

func (o execOp) apply(ctx context.Context, b *batch) (any, error, error) {
	tx, err := b.sqlOp(ctx)
	if err != nil {
		return nil, nil, err
	}
	if _, err := tx.Exec(ctx, o.sql); err != nil {
		return nil, nil, err
	}
	return "done", nil, nil
}

func newInternalRegion(t *testing.T) (*Region, context.Context) {
	t.Helper()
	ctx := context.Background()
	pool, _ := testpg.NewPool(t, "region", 10)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	r, err := New(Config{Name: "us", Clock: clock.NewManual(now), Sweep: SweepConfig{Interval: time.Hour},
		Logger: slog.New(slog.DiscardHandler)}, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Lead(ctx, 1); err != nil {
		t.Fatal(err)
	}
	terms := SaleTerms{Sale: "s", SKUs: []string{"x"}, PerUserLimit: 10, HoldTTL: time.Minute, OpensAt: now.Add(-time.Hour)}
	if err := r.PutSale(ctx, 1, terms); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t", Sale: "s", SKU: "x", Units: 10}); err != nil {
		t.Fatal(err)
	}
	return r, ctx
}

// anyOp lets one test batch hold ops of different result types.
type anyOp[T any] struct{ op op[T] }

func (a anyOp[T]) apply(ctx context.Context, b *batch) (any, error, error) {
	res, outcome, fatal := a.op.apply(ctx, b)
	return res, outcome, fatal
}

// runBatch commits ops as one batch on the region's writer (the writer goroutine is idle:
// nothing else is submitted meanwhile) and returns each op's answer. Each op is an op[any]
// or one of the region's ops named below.
func runBatch(r *Region, ops ...any) []*request[any] {
	ps := make([]*request[any], len(ops))
	pend := make([]pending, len(ops))
	for i, o := range ops {
		var a op[any]
		switch o := o.(type) {
		case *reserveOp:
			a = anyOp[reserveAnswer]{o}
		case *confirmOp:
			a = anyOp[ConfirmResult]{o}
		case *releaseOp:
			a = anyOp[Hold]{o}
		case *refuseOp:
			a = anyOp[transfer.InState]{o}
		case op[any]:
			a = o
		default:
			panic(fmt.Sprintf("runBatch: an op of type %T", o))
		}
		ps[i] = &request[any]{op: a, done: make(chan struct{})}
		pend[i] = ps[i]
	}
	r.w.commit(pend)
	return ps
}

func (r *Region) reserveOpFor(user, key string) *reserveOp {
	t, _ := r.sales.Load("s")
	return &reserveOp{maxKeys: r.cfg.MaxKeysPerUser, req: ReserveRequest{Sale: "s", SKU: "x", User: user, Quantity: 1, RequestKey: key},
		terms: t.(SaleTerms), holdID: newHoldID(&r.cfg), region: r.cfg.Name, exhausted: r.exhausted}
}

// checkCacheMatchesDB: the cached available count is the stored one.
func checkCacheMatchesDB(t *testing.T, r *Region, ctx context.Context) transfer.Units {
	t.Helper()
	var stored int64
	if err := r.pool.QueryRow(ctx, `SELECT available FROM pools WHERE sale_id = 's' AND sku = 'x'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	cached, ok := r.cachedAvailable(poolKey{"s", "x"})
	if !ok || cached != transfer.Units(stored) {
		t.Errorf("cached available %d (known %v), stored %d", cached, ok, stored)
	}
	return transfer.Units(stored)
}

func holdRows(t *testing.T, r *Region, ctx context.Context) int {
	t.Helper()
	var n int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM holds`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWriterFatalOpFailsWholeBatch: an op failing inside the transaction rolls back the
// reserves before and after it in the same batch; every one of them gets the error, and the
// cache is reloaded.
func TestWriterFatalOpFailsWholeBatch(t *testing.T) {
	r, ctx := newInternalRegion(t)
	ps := runBatch(r, r.reserveOpFor("a", "k1"), r.reserveOpFor("b", "k1"), execOp{`SELECT * FROM no_such_table`}, r.reserveOpFor("c", "k1"))
	for i, p := range ps {
		if p.err == nil {
			t.Errorf("op %d of a failed batch answered success: %v", i, p.res)
		}
		if errors.Is(p.err, ErrUnknownOutcome) || !errors.Is(p.err, ErrAborted) {
			t.Errorf("op %d: %v; a failure inside the transaction is definite (ABORTED), not unknown", i, p.err)
		}
	}
	if n := holdRows(t, r, ctx); n != 0 {
		t.Errorf("%d holds stored by a failed batch", n)
	}
	if got := checkCacheMatchesDB(t, r, ctx); got != 10 {
		t.Errorf("available %d after a failed batch, want 10", got)
	}
	// The region keeps serving.
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "a", Quantity: 1, RequestKey: "k1"}); err != nil {
		t.Fatalf("reserve after a failed batch: %v", err)
	}
	checkCacheMatchesDB(t, r, ctx)
}

// TestWriterCommitFailureIsNotSuccess: the batch's statements all succeed but COMMIT fails
// (a deferred constraint is checked at commit; a dropped connection or a timeout during
// COMMIT fail the same way). No request in the batch may be told it succeeded, since nothing
// was stored (I6), and the cache must not keep the uncommitted counts.
func TestWriterCommitFailureIsNotSuccess(t *testing.T) {
	r, ctx := newInternalRegion(t)
	if _, err := r.pool.Exec(ctx, `CREATE TABLE commit_bomb (id int, CONSTRAINT commit_bomb_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	ps := runBatch(r, r.reserveOpFor("a", "k1"), execOp{`INSERT INTO commit_bomb VALUES (1), (1)`}, r.reserveOpFor("b", "k1"))
	stored := holdRows(t, r, ctx)
	for i, p := range ps {
		if p.err == nil && stored == 0 {
			t.Errorf("op %d answered success (%v), but its batch did not commit", i, p.res)
		}
		if p.err != nil && !errors.Is(p.err, ErrUnknownOutcome) {
			t.Errorf("op %d: %v; a failed COMMIT is an unknown outcome", i, p.err)
		}
	}
	if stored != 0 {
		t.Errorf("%d holds stored by a batch whose commit failed", stored)
	}
	checkCacheMatchesDB(t, r, ctx)
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "a", Quantity: 1, RequestKey: "k1"}); err != nil {
		t.Fatalf("reserve after a failed batch: %v", err)
	}
	checkCacheMatchesDB(t, r, ctx)
}

// TestWriterOutcomesDoNotFailTheBatch: business outcomes (exhausted, limit, not found) are
// answers, not failures; the batch's other ops commit.
func TestWriterOutcomesDoNotFailTheBatch(t *testing.T) {
	r, ctx := newInternalRegion(t)
	big := r.reserveOpFor("a", "big")
	big.req.Quantity = 11
	ps := runBatch(r, r.reserveOpFor("a", "k1"), big, &confirmOp{holdID: "us.nosuch", payment: "p", region: "us"}, r.reserveOpFor("b", "k1"))
	if ps[0].err != nil || ps[3].err != nil {
		t.Fatalf("reserves: %v, %v", ps[0].err, ps[3].err)
	}
	if !errors.Is(ps[1].err, ErrRegionExhausted) || !errors.Is(ps[2].err, ErrNotFound) {
		t.Errorf("outcomes: %v, %v", ps[1].err, ps[2].err)
	}
	if n := holdRows(t, r, ctx); n != 2 {
		t.Errorf("%d holds stored, want 2", n)
	}
	if got := checkCacheMatchesDB(t, r, ctx); got != 8 {
		t.Errorf("available %d, want 8", got)
	}
}

// TestWriterOneRoundTripGuard: a batch of in-memory ops goes out as one pipeline that
// commits at its end, so its guards run in the server. A hold closed behind the writer's
// back makes the release's guard change 0 rows instead of 1: the whole batch (a reserve
// with it) must roll back, nobody is told it succeeded, and the leader reloads.
func TestWriterOneRoundTripGuard(t *testing.T) {
	r, ctx := newInternalRegion(t)
	res, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "a", Quantity: 1, RequestKey: "k0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, `UPDATE holds SET state = 'released', closed_at = now() WHERE hold_id = $1`, res.Hold.ID); err != nil {
		t.Fatal(err)
	}
	before := holdRows(t, r, ctx)
	ps := runBatch(r, r.reserveOpFor("b", "k1"), &releaseOp{holdID: res.Hold.ID, region: r.cfg.Name})
	for i, p := range ps {
		if p.err == nil {
			t.Errorf("op %d answered success (%v) in a batch whose guard failed", i, p.res)
		} else if !strings.Contains(p.err.Error(), "guard failed: hold closes changed 0 rows, want 1") {
			t.Errorf("op %d: %v; want the server's guard failure", i, p.err)
		}
	}
	if after := holdRows(t, r, ctx); after != before {
		t.Errorf("hold rows %d → %d: the failed batch's reserve was stored", before, after)
	}
	checkCacheMatchesDB(t, r, ctx)
}

// TestEndBackendStopsAnOrphanedPipeline: after a one-round-trip batch with an unknown
// outcome, the leader ends the backend that ran it before reloading, so nothing of it can
// commit after the reload's snapshot. A backend busy in a statement is ended, and
// endBackend returns only once it is gone.
func TestEndBackendStopsAnOrphanedPipeline(t *testing.T) {
	r, ctx := newInternalRegion(t)
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `SELECT pg_sleep(30)`)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // let it start
	start := time.Now()
	if err := endBackend(ctx, r.pool, pid); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("the ended backend's statement succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the statement of the ended backend is still running")
	}
	conn.Release()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("endBackend took %s", took)
	}
	if err := endBackend(ctx, r.pool, pid); err != nil { // already gone: nothing to do
		t.Errorf("endBackend of a gone backend: %v", err)
	}
}

// TestEndBackendLeavesANewerBackendWithTheSamePid: an orphaned batch's backend is named by the pid and
// the start time its pool recorded at connect (as flushOnce takes them), so one that merely
// has the pid of a backend already gone (pids are reused) is left alone, while the right start
// time ends it.
func TestEndBackendLeavesANewerBackendWithTheSamePid(t *testing.T) {
	r, ctx := newInternalRegion(t)
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	started, known := pgutil.BackendStart(conn.Conn().PgConn()) // what flushOnce records
	if !known {
		t.Fatal("the pool did not record the backend's start")
	}
	stale := &orphanError{pid: pid, started: started.Add(-time.Second), startKnown: true}
	if err := stale.end(ctx, r.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("a backend with another start time was ended: %v", err)
	}
	if err := (&orphanError{pid: pid, started: started, startKnown: true}).end(ctx, r.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("the named backend still answers")
	}
}

// TestRefusedStatementFailsItsOpAlone: a coordinator op whose statement the database refuses
// (a refusal with units −1, which validation stops before the writer; sent here straight to
// the writer) fails alone: the 150 reserves around it in the same batch commit, the leader
// does not reload, and the refused op leaves no record and no change in memory.
func TestRefusedStatementFailsItsOpAlone(t *testing.T) {
	r, ctx := newInternalRegion(t)
	if _, err := r.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t2", Sale: "s", SKU: "x", Units: 190}); err != nil {
		t.Fatal(err)
	}
	failuresBefore := r.BatchFailures()
	var ops []any
	for i := range 150 {
		if i == 75 {
			ops = append(ops, &refuseOp{req: CreditRequest{Generation: 1, TransferID: "bad", Sale: "s", SKU: "x", Units: -1}})
		}
		ops = append(ops, r.reserveOpFor("u"+strconv.Itoa(i), "k"))
	}
	ps := runBatch(r, ops...)
	for i, p := range ps {
		_, isRefuse := p.op.(anyOp[transfer.InState])
		switch {
		case isRefuse && (p.err == nil || errors.Is(p.err, ErrAborted)):
			t.Errorf("the bad refusal: %v, %v; want its own error", p.res, p.err)
		case !isRefuse && p.err != nil:
			t.Errorf("reserve %d in the same batch: %v; want it to commit", i, p.err)
		}
	}
	if got := r.BatchFailures() - failuresBefore; got != 0 {
		t.Errorf("%d batch failures (each a reload); want none", got)
	}
	if n := holdRows(t, r, ctx); n != 150 {
		t.Errorf("%d holds stored; want 150", n)
	}
	if got := checkCacheMatchesDB(t, r, ctx); got != 200-150 {
		t.Errorf("available %d; want 50", got)
	}
	var records int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM transfers_in WHERE transfer_id = 'bad'`).Scan(&records); err != nil || records != 0 {
		t.Errorf("the bad refusal left %d records (%v)", records, err)
	}
}
