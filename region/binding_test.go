package region_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/region"
)

// etcdBinds is a real Binder on an embedded etcd, counting the binds each region sends it;
// the binder can be closed and replaced to make the binding writes fail and work again.
type etcdBinds struct {
	etcd   *fencing.Client
	binder atomic.Pointer[fencing.Binder]
	calls  sync.Map // region -> *atomic.Int64
}

func newEtcdBinds(t *testing.T) *etcdBinds {
	t.Helper()
	m, err := fencing.StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	c, err := fencing.Dial([]string{m.ClientURL}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := &etcdBinds{etcd: c}
	b.binder.Store(fencing.NewBinder(c, time.Hour))
	t.Cleanup(func() { // the binder in use then; before the etcd client closes (cleanups run last first)
		if err := b.binder.Load().Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// config makes a region bind through b.
func (b *etcdBinds) config(cfg *region.Config) {
	cfg.Binding.Bind = func(ctx context.Context, sale, user, region string) (string, error) {
		n, _ := b.calls.LoadOrStore(region, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return b.binder.Load().Bind(ctx, sale, user, region)
	}
}

// of is how many binds region sent.
func (b *etcdBinds) of(region string) int64 {
	n, ok := b.calls.Load(region)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

func (b *etcdBinds) bound(t *testing.T, user string) string {
	t.Helper()
	got, ok, err := fencing.Bound(context.Background(), b.etcd, testSale, user)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return ""
	}
	return got
}

func named(name string) func(*region.Config) { return func(c *region.Config) { c.Name = name } }

// boundTo says err is BOUND_ELSEWHERE naming region.
func boundTo(err error, name string) bool {
	var be *apierr.BoundError
	return errors.As(err, &be) && be.Region == name && be.Sale == testSale && errors.Is(err, apierr.ErrBoundElsewhere)
}

// TestFirstReservationBindsTheBuyer: in a sale without a waiting room a buyer's first
// reservation binds them to its region in etcd; their later reservations there do not reach
// etcd, and another region answers BOUND_ELSEWHERE naming the first, from etcd once and then
// from memory, holding nothing for them.
func TestFirstReservationBindsTheBuyer(t *testing.T) {
	b := newEtcdBinds(t)
	us, eu := newEnv(t, b.config), newEnv(t, b.config, named("eu"))
	us.sale(defaultTerms(testSale, 2), 10)
	eu.sale(defaultTerms(testSale, 2), 10)

	us.mustReserve("alice", "k1", 1)
	if n := b.of("us"); n != 1 {
		t.Fatalf("the first reservation sent %d binds; want 1", n)
	}
	if got := b.bound(t, "alice"); got != "us" {
		t.Fatalf("alice is bound to %q in etcd; want us", got)
	}
	us.mustReserve("alice", "k2", 1)
	if _, err := us.reserve("alice", "k3", 1); !errors.Is(err, region.ErrLimitExceeded) {
		t.Fatalf("a third unit: %v; want LIMIT_EXCEEDED", err)
	}
	if n := b.of("us"); n != 1 {
		t.Fatalf("later reservations at the same region sent binds: %d in all; want the first one only", n)
	}
	for i, key := range []string{"e1", "e2"} {
		if _, err := eu.reserve("alice", key, 1); !boundTo(err, "us") {
			t.Fatalf("alice at eu: %v; want BOUND_ELSEWHERE naming us", err)
		}
		if n := b.of("eu"); n != 1 {
			t.Fatalf("after %d refusals eu sent %d binds; want 1 (then its memory answers)", i+1, n)
		}
	}
	eu.checkPool(testSale, testSKU, counts{10, 0, 0})
	us.checkPool(testSale, testSKU, counts{8, 2, 0})

	// Another region's first buyer is bound there, and us refuses them.
	eu.mustReserve("bob", "k1", 2)
	if _, err := us.reserve("bob", "k1", 1); !boundTo(err, "eu") {
		t.Fatalf("bob at us: %v; want BOUND_ELSEWHERE naming eu", err)
	}
}

// TestConcurrentFirstReservationsBindOnce: one buyer's reservations at one region all at
// once send one bind between them, and the per-user limit holds.
func TestConcurrentFirstReservationsBindOnce(t *testing.T) {
	b := newEtcdBinds(t)
	e := newEnv(t, b.config)
	e.sale(defaultTerms(testSale, 2), 100)
	var wg sync.WaitGroup
	var granted atomic.Int64
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.reserve("carol", "k"+strconv.Itoa(i), 1); err == nil {
				granted.Add(1)
			} else if !errors.Is(err, region.ErrLimitExceeded) {
				t.Errorf("reserve %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if granted.Load() != 2 || b.of("us") != 1 {
		t.Fatalf("granted %d, binds sent %d; want 2 and 1", granted.Load(), b.of("us"))
	}
}

// TestBindingFailureRefusesTheReservation: a binding that cannot be written refuses the
// reservation ABORTED (nothing done: ask again), holding nothing; once etcd answers again
// the same request succeeds.
func TestBindingFailureRefusesTheReservation(t *testing.T) {
	b := newEtcdBinds(t)
	e := newEnv(t, b.config)
	e.sale(defaultTerms(testSale, 2), 10)
	closed := b.binder.Load()
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := e.reserve("dave", "k1", 1)
	if !errors.Is(err, region.ErrAborted) || !strings.Contains(err.Error(), fencing.ErrBinderClosed.Error()) {
		t.Fatalf("reserve with the binding failing: %v; want ABORTED", err)
	}
	e.checkPool(testSale, testSKU, counts{10, 0, 0})
	if got := b.bound(t, "dave"); got != "" {
		t.Fatalf("dave is bound to %q", got)
	}
	b.binder.Store(fencing.NewBinder(b.etcd, time.Hour))
	if h := e.mustReserve("dave", "k1", 1); h.Quantity != 1 {
		t.Fatalf("hold %+v", h)
	}
	if got := b.bound(t, "dave"); got != "us" {
		t.Fatalf("dave is bound to %q; want us", got)
	}
}

// TestNoBindingWithoutAUnitOrTheLead: a reservation the empty pool answers, one a paused
// sale refuses, and one a standby answers NOT_LEADER, bind no one: a buyer is not tied to a
// region that could not serve them.
func TestNoBindingWithoutAUnitOrTheLead(t *testing.T) {
	b := newEtcdBinds(t)
	e := newEnv(t, b.config)
	e.sale(defaultTerms(testSale, 2), 2)
	e.mustReserve("erin", "k1", 1)
	e.pause(1, "", true, 1, "test")
	e.wantPaused(testSKU, "hank", "sale "+testSale+" is paused")
	e.wantPaused(testSKU, "erin", "sale "+testSale+" is paused") // bound before: from memory
	e.pause(1, "", false, 2, "")
	e.mustReserve("erin", "k2", 1)
	if _, err := e.reserve("frank", "k1", 1); !errors.Is(err, region.ErrRegionExhausted) {
		t.Fatalf("reserve at an empty pool: %v; want REGION_EXHAUSTED", err)
	}
	cfg := region.Config{Name: "us", Clock: e.clk, Logger: quietLogger}
	b.config(&cfg)
	standby, err := region.New(cfg, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Close)
	if _, err := standby.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "gina", Quantity: 1, RequestKey: "k"}); !errors.Is(err, region.ErrNotLeader) {
		t.Fatalf("reserve at a standby: %v; want NOT_LEADER", err)
	}
	if n := b.of("us"); n != 1 {
		t.Fatalf("%d binds sent; want 1, erin's", n)
	}
	if b.bound(t, "frank") != "" || b.bound(t, "gina") != "" || b.bound(t, "hank") != "" {
		t.Fatal("a buyer refused without a decision was bound")
	}
}
