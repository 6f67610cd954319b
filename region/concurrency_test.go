package region_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// TestConcurrentReservesNeverOversell: 200 goroutines × 25 reserves of one unit against
// 1,000 units. Exactly 1,000 are granted, every other answer is REGION_EXHAUSTED, and the
// books balance.
func TestConcurrentReservesNeverOversell(t *testing.T) {
	testNeverOversell(t, 1000, 200, 25)
}

// TestNeverOversellSmallBatches: the same with small, windowed batches (many commits, each
// batch mixing grants and refusals at its end).
func TestNeverOversellSmallBatches(t *testing.T) {
	testNeverOversell(t, 300, 50, 10, func(c *region.Config) { c.Writer.MaxBatch = 7; c.Writer.BatchWindow = time.Millisecond })
}

func testNeverOversell(t *testing.T, units transfer.Units, workers, each int, opts ...func(*region.Config)) {
	e := newEnv(t, opts...)
	e.sale(defaultTerms(testSale, 1000), units)

	var granted, exhausted atomic.Int64
	var mu sync.Mutex
	ids := map[string]bool{}
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("user-%d", w)
			for i := range each {
				res, err := e.reserve(user, fmt.Sprintf("key-%d", i), 1)
				switch {
				case err == nil:
					granted.Add(1)
					mu.Lock()
					dup := ids[res.Hold.ID]
					ids[res.Hold.ID] = true
					mu.Unlock()
					if dup || res.Replayed || res.Hold.State != region.Held || res.Hold.Quantity != 1 || res.Hold.User != user {
						errs <- fmt.Errorf("bad grant %+v (dup %v)", res, dup)
					}
				case errors.Is(err, region.ErrRegionExhausted):
					exhausted.Add(1)
				default:
					errs <- fmt.Errorf("%s key-%d: %w", user, i, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if granted.Load() != int64(units) || exhausted.Load() != int64(workers*each)-int64(units) {
		t.Fatalf("granted %d, exhausted %d; want %d and %d", granted.Load(), exhausted.Load(), units, int64(workers*each)-int64(units))
	}
	if n := count(t, e.pool, `SELECT count(*) FROM holds WHERE state = 'held'`); n != int(units) {
		t.Errorf("%d held hold rows, want %d", n, units)
	}
	e.checkPool(testSale, testSKU, counts{0, units, 0})
	// Once empty, the answer stays REGION_EXHAUSTED.
	if _, err := e.reserve("late", "k", 1); !errors.Is(err, region.ErrRegionExhausted) {
		t.Errorf("reserve on an empty pool: %v, want ErrRegionExhausted", err)
	}
}

// TestRequestKeyIdempotency: one request key retried concurrently yields one hold; the key
// reused for another request is ALREADY_EXISTS; a retry after the pool ran dry still gets
// its hold back.
func TestRequestKeyIdempotency(t *testing.T) {
	const units, q, retries = 10, 2, 100
	e := newEnv(t)
	e.sale(defaultTerms(testSale, units, testSKU, "sku2"), units)

	results := make([]region.ReserveResult, retries)
	errs := make([]error, retries)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range retries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = e.reserve("alice", "same-key", q)
		}()
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i := range retries {
		if errs[i] != nil {
			t.Fatalf("retry %d: %v", i, errs[i])
		}
		if results[i].Hold.ID != results[0].Hold.ID {
			t.Fatalf("retry %d got hold %s, retry 0 got %s", i, results[i].Hold.ID, results[0].Hold.ID)
		}
		if !results[i].Replayed {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d answers were not replays, want exactly 1", fresh)
	}
	orig := results[0].Hold
	if n := count(t, e.pool, `SELECT count(*) FROM holds`); n != 1 {
		t.Fatalf("%d hold rows, want 1", n)
	}
	e.checkPool(testSale, testSKU, counts{units - q, q, 0})

	// The same key for a different request.
	if _, err := e.reserve("alice", "same-key", q+1); !errors.Is(err, region.ErrAlreadyExists) {
		t.Errorf("same key, other quantity: %v, want ErrAlreadyExists", err)
	}
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: "sku2", User: "alice", Quantity: q, RequestKey: "same-key"}); !errors.Is(err, region.ErrAlreadyExists) {
		t.Errorf("same key, other sku: %v, want ErrAlreadyExists", err)
	}
	// The key is per user: another user's identical key is a new request.
	other := e.mustReserve("bob", "same-key", q)
	if other.ID == orig.ID {
		t.Errorf("bob's request got alice's hold")
	}
	e.checkPool(testSale, testSKU, counts{units - 2*q, 2 * q, 0})

	// Drain the pool, then retry: the original hold comes back, a new key is exhausted, and
	// the key reused with another quantity is still ALREADY_EXISTS (the no-write path).
	e.mustReserve("carol", "drain", units-2*q)
	res, err := e.reserve("alice", "same-key", q)
	if err != nil || !res.Replayed || res.Hold.ID != orig.ID || res.Hold.State != region.Held || res.Hold.Quantity != q {
		t.Fatalf("retry on an empty pool: %+v, %v; want replay of %s", res, err, orig.ID)
	}
	if !res.Hold.ExpiresAt.Equal(orig.ExpiresAt) || !res.Hold.CreatedAt.Equal(orig.CreatedAt) {
		t.Errorf("replayed hold times %s/%s differ from the original %s/%s", res.Hold.CreatedAt, res.Hold.ExpiresAt, orig.CreatedAt, orig.ExpiresAt)
	}
	if _, err := e.reserve("alice", "same-key", 1); !errors.Is(err, region.ErrAlreadyExists) {
		t.Errorf("same key, other quantity on an empty pool: %v, want ErrAlreadyExists", err)
	}
	if _, err := e.reserve("alice", "new-key", 1); !errors.Is(err, region.ErrRegionExhausted) {
		t.Errorf("new key on an empty pool: %v, want ErrRegionExhausted", err)
	}
	// A retry returns the hold in its current state.
	if c, err := e.r.Confirm(e.ctx, orig.ID, "pay"); err != nil || !c.Sold {
		t.Fatalf("confirm: %+v, %v", c, err)
	}
	res, err = e.reserve("alice", "same-key", q)
	if err != nil || !res.Replayed || res.Hold.ID != orig.ID || res.Hold.State != region.Sold || res.Hold.PaymentID != "pay" {
		t.Errorf("retry after confirm: %+v, %v; want replay of the sold hold", res, err)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM holds`); n != 3 {
		t.Errorf("%d hold rows, want 3", n)
	}
	e.checkPool(testSale, testSKU, counts{0, units - q, q})
}

// TestRequestKeyIdempotencyExactFit: the pool holds exactly the quantity one request key
// asks for; concurrent retries race the commit that empties it (and so switch to the
// no-write path) and must all still get the same hold.
func TestRequestKeyIdempotencyExactFit(t *testing.T) {
	const q, retries = 3, 100
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5), q)
	ids := make([]string, retries)
	errs := make([]error, retries)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range retries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := e.reserve("alice", "only", q)
			ids[i], errs[i] = res.Hold.ID, err
		}()
	}
	close(start)
	wg.Wait()
	for i := range retries {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("retry %d: hold %q, %v; retry 0 got %q", i, ids[i], errs[i], ids[0])
		}
	}
	e.checkPool(testSale, testSKU, counts{0, q, 0})
}

// TestPerUserLimitUnderConcurrency: a user with limit 2 fires 20 concurrent reserves with
// distinct keys; at most 2 are granted (here exactly 2: stock is plentiful), the others are
// LIMIT_EXCEEDED. A quantity over the limit is an invalid argument naming "quantity".
func TestPerUserLimitUnderConcurrency(t *testing.T) {
	const limit, n = 2, 20
	e := newEnv(t)
	e.sale(defaultTerms(testSale, limit), 100)

	var granted, limited atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := e.reserve("greedy", fmt.Sprintf("k%d", i), 1)
			switch {
			case err == nil:
				granted.Add(1)
			case errors.Is(err, region.ErrLimitExceeded):
				limited.Add(1)
			default:
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if granted.Load() != limit || limited.Load() != n-limit {
		t.Fatalf("granted %d, limited %d; want %d and %d", granted.Load(), limited.Load(), limit, n-limit)
	}
	e.checkPool(testSale, testSKU, counts{100 - limit, limit, 0})

	_, err := e.reserve("someone", "big", limit+1)
	if f := fieldOf(err); f != "quantity" {
		t.Errorf("quantity over the limit: %v (field %q), want invalid quantity", err, f)
	}
	// Another user is not affected by greedy's count.
	e.mustReserve("modest", "k", limit)
	e.checkPool(testSale, testSKU, counts{100 - 2*limit, 2 * limit, 0})
	if n := count(t, e.pool, `SELECT count(*) FROM holds`); n != limit+1 {
		t.Errorf("%d hold rows, want %d", n, limit+1)
	}
}

// TestLimitIsPerSKU: the per-user limit counts per (sale, sku), so the same user can hold the
// limit of each SKU.
func TestLimitIsPerSKU(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 2, "a", "b"), 10)
	for _, sku := range []string{"a", "b"} {
		if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: sku, User: "u", Quantity: 2, RequestKey: "k-" + sku}); err != nil {
			t.Fatalf("reserve %s: %v", sku, err)
		}
	}
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: "a", User: "u", Quantity: 1, RequestKey: "k3"}); !errors.Is(err, region.ErrLimitExceeded) {
		t.Errorf("third unit of a: %v, want ErrLimitExceeded", err)
	}
	e.checkPool(testSale, "a", counts{8, 2, 0})
	e.checkPool(testSale, "b", counts{8, 2, 0})
}

// TestExhaustedAnswerNeedsNoWrite: once the region knows a pool is empty, a reserve is
// answered without a write transaction (docs/architecture.md, "Reserve, step by step": the sold-out answer is cheap). Shown
// by holding the epoch row lock every writer batch needs: the answers still come at once.
func TestExhaustedAnswerNeedsNoWrite(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5), 1)
	h := e.mustReserve("alice", "k", 1)

	lock, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(e.ctx)
	if _, err := lock.Exec(e.ctx, `SELECT epoch FROM leader_epoch WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := e.r.Reserve(ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "bob", Quantity: 1, RequestKey: "k"}); !errors.Is(err, region.ErrRegionExhausted) {
		t.Errorf("reserve on an empty pool while the writer is blocked: %v, want ErrRegionExhausted", err)
	}
	if res, err := e.r.Reserve(ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "alice", Quantity: 1, RequestKey: "k"}); err != nil || res.Hold.ID != h.ID {
		t.Errorf("retry on an empty pool while the writer is blocked: %+v, %v", res, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("answers on an empty pool took %s: they waited for the writer", d)
	}
}
