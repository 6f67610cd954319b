package fencing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/netfault"
	"github.com/quotaworks/quota/internal/testnet"
)

// startInternalEtcd starts an embedded etcd and dials it.
func startInternalEtcd(t *testing.T) (*Embedded, *Client) {
	t.Helper()
	e, err := StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	c, err := Dial([]string{e.ClientURL}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return e, c
}

// answer is the answer r got (it must have one).
func answer(t *testing.T, r *bindReq) bindRes {
	t.Helper()
	select {
	case res := <-r.res:
		return res
	default:
		t.Fatalf("%s: no answer", r.key)
		return bindRes{}
	}
}

// TestBindBatchWithSomeKeysBound: one batch whose keys are partly bound already fails as a
// whole; its reads answer the bound keys with their region, untouched, and the next batch
// binds exactly the absent ones, on the sale's lease (a key asked twice in a batch is
// written once and both hear the answer).
func TestBindBatchWithSomeKeysBound(t *testing.T) {
	ctx := context.Background()
	_, c := startInternalEtcd(t)
	b := NewBinder(c, time.Hour)
	defer b.Close()
	bound := map[int]bool{0: true, 3: true, 6: true}
	modRev := map[int]int64{}
	for u := range bound {
		if _, err := Bind(ctx, c, "s", fmt.Sprint("u", u), "eu", NoLease); err != nil {
			t.Fatal(err)
		}
		resp, err := c.c.Get(ctx, bindKey("s", fmt.Sprint("u", u)))
		if err != nil {
			t.Fatal(err)
		}
		modRev[u] = resp.Kvs[0].ModRevision
	}
	sl, err := b.lease(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	var batch []*bindReq
	for u := range 10 {
		batch = append(batch, &bindReq{ctx: ctx, key: bindKey("s", fmt.Sprint("u", u)), region: "us", lease: sl.id, res: make(chan bindRes, 1)})
	}
	dup := &bindReq{ctx: ctx, key: bindKey("s", "u1"), region: "ap", lease: sl.id, res: make(chan bindRes, 1)}
	batch = append(batch, dup)

	left := b.commit(batch, true)
	if len(left) != 10-len(bound)+1 {
		t.Fatalf("%d binds left after the first transaction; want the 8 of absent keys", len(left))
	}
	for u := range bound {
		if res := answer(t, batch[u]); res.err != nil || res.bound != "eu" {
			t.Errorf("u%d: %+v; want eu, as recorded", u, res)
		}
	}
	if left = b.commit(left, true); len(left) != 0 {
		t.Fatalf("%d binds left after the second transaction", len(left))
	}
	for u := range 10 {
		if bound[u] {
			continue
		}
		if res := answer(t, batch[u]); res.err != nil || res.bound != "us" {
			t.Errorf("u%d: %+v; want us", u, res)
		}
	}
	if res := answer(t, dup); res.err != nil || res.bound != "us" {
		t.Errorf("u1 asked again in the batch: %+v; want us, the first ask's", res)
	}
	if n := b.Txns(); n != 2 {
		t.Errorf("%d transactions; want 2 (one failed, one for the absent keys)", n)
	}
	for u := range 10 {
		resp, err := c.c.Get(ctx, bindKey("s", fmt.Sprint("u", u)))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("u%d: %v, %v", u, resp, err)
		}
		kv := resp.Kvs[0]
		switch {
		case bound[u] && (string(kv.Value) != "eu" || kv.ModRevision != modRev[u]):
			t.Errorf("u%d: %q at revision %d; want eu, unchanged at %d", u, kv.Value, kv.ModRevision, modRev[u])
		case !bound[u] && (string(kv.Value) != "us" || LeaseID(kv.Lease) != sl.id):
			t.Errorf("u%d: %q on lease %x; want us on the sale's lease %x", u, kv.Value, kv.Lease, sl.id)
		}
	}
}

// TestBindQueueIsBounded: while etcd does not answer, binds wait in a bounded queue; one
// beyond it is refused at once OVERLOADED, and nothing waits past its context or Close.
func TestBindQueueIsBounded(t *testing.T) {
	ctx := context.Background()
	e, c := startInternalEtcd(t)
	b := newBinder(c, nil, time.Hour, 2)
	defer b.Close()
	if _, err := b.Bind(ctx, "s", "warm", "us"); err != nil { // the sale's lease
		t.Fatal(err)
	}
	e.Close() // etcd gone: the next transaction waits for its callers' deadline
	errs := make(chan error, 3)
	bind := func(user string) {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := b.Bind(bctx, "s", user, "us")
		errs <- err
	}
	go bind("a") // the batch writer takes it and waits on etcd
	waitFor(t, func() bool { return b.Txns() == 2 })
	go bind("b")
	go bind("c")
	waitFor(t, func() bool { return len(b.queue) == 2 })
	start := time.Now()
	_, err := b.Bind(ctx, "s", "d", "us")
	if !errors.Is(err, ErrBindQueueFull) || !errors.Is(err, apierr.ErrOverloaded) {
		t.Fatalf("bind beyond the queue: %v; want OVERLOADED", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refused after %v; want at once", d)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; err == nil {
			t.Error("a bind succeeded with etcd gone")
		}
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
	}
}

// nearBinder is a Binder writing through a near member: etcd itself, through a proxy the test
// cuts (a member that is down) or freezes (one that is stopped).
func nearBinder(t *testing.T) (*Binder, *netfault.Proxy) {
	t.Helper()
	e, c := startInternalEtcd(t)
	p, err := netfault.Listen(strings.TrimPrefix(e.ClientURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	near, err := Dial([]string{"http://" + p.Addr()}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b := NewBinderNear(c, near, time.Hour)
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := near.Close(); err != nil {
			t.Logf("closing the near client: %v", err) // its member was cut: nothing to do about it
		}
	})
	return b, p
}

// TestBinderWritesThroughTheNearMember: a Binder with a near member writes its binds through
// it; once that member is down, a bind is written through every member (after at most
// nearTry), and the binds after it do not try the near member again for nearRest.
func TestBinderWritesThroughTheNearMember(t *testing.T) {
	b, f := nearBinder(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		if got, err := b.Bind(ctx, "s", fmt.Sprint("near-", i), "us"); err != nil || got != "us" {
			t.Fatalf("bind %d: %q, %v", i, got, err)
		}
	}
	if b.NearTxns() != 3 || b.Txns() != 3 {
		t.Fatalf("%d of %d transactions through the near member; want 3 of 3", b.NearTxns(), b.Txns())
	}
	f.Cut()
	start := time.Now()
	if got, err := b.Bind(ctx, "s", "after", "eu"); err != nil || got != "eu" {
		t.Fatalf("bind with the near member down: %q, %v", got, err)
	}
	if d := time.Since(start); d > nearTry+2*time.Second {
		t.Errorf("the bind with the near member down took %s; want within %s and 2 s", d.Round(time.Millisecond), nearTry)
	}
	start = time.Now()
	if got, err := b.Bind(ctx, "s", "later", "eu"); err != nil || got != "eu" {
		t.Fatalf("the next bind: %q, %v", got, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the next bind took %s: it tried the near member again", d.Round(time.Millisecond))
	}
	if b.NearTxns() != 3 {
		t.Errorf("%d transactions through the near member; want the first 3 only", b.NearTxns())
	}
}

// TestBinderSkipsAFrozenNearMember: the near member freezes (its connection open, nothing
// answered). A bind whose caller gives it 2 s (as a reservation's edge or a waiting room's
// bind do) is still written, through every member, in the half of its time the near member
// does not get; the next bind does not wait on the near member at all.
func TestBinderSkipsAFrozenNearMember(t *testing.T) {
	b, f := nearBinder(t)
	bind := func(user string) (string, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		got, err := b.Bind(ctx, "s", user, "us")
		return got, time.Since(start), err
	}
	if got, _, err := bind("warm"); err != nil || got != "us" || b.NearTxns() != 1 {
		t.Fatalf("bind through the near member: %q, %v (%d through it)", got, err, b.NearTxns())
	}
	f.Freeze()
	if got, took, err := bind("frozen"); err != nil || got != "us" {
		t.Fatalf("bind with the near member frozen: %q, %v after %s; want it written through every member", got, err, took.Round(time.Millisecond))
	}
	if got, took, err := bind("next"); err != nil || got != "us" || took > 500*time.Millisecond {
		t.Errorf("the next bind: %q, %v after %s; want it at once, not waiting on the frozen member", got, err, took.Round(time.Millisecond))
	}
	if b.NearTxns() != 1 {
		t.Errorf("%d transactions through the near member; want the first only", b.NearTxns())
	}
}
