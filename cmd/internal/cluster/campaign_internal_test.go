package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/testnet"
)

// TestTakingOverStopsWhenTheLeaseIsLost: a holder still taking over (its lead blocked, as a
// region's epoch raise waits on a stalled older leader) is stopped once its lease is lost,
// here by etcd going away, instead of going on until the process stops.
func TestTakingOverStopsWhenTheLeaseIsLost(t *testing.T) {
	const ttl = 2 * time.Second
	e, err := fencing.StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	etcd, err := fencing.Dial([]string{e.ClientURL}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	var once sync.Once
	entered, ended := make(chan struct{}), make(chan error, 1)
	tm := term{etcd: etcd, role: "test", addr: "127.0.0.1:1", ttl: ttl, log: slog.New(slog.DiscardHandler),
		stepDn: func() {}, crashed: &atomic.Bool{},
		lead: func(ctx context.Context, _ int64) error {
			first := false
			once.Do(func() { first = true; close(entered) })
			if !first {
				return errors.New("led twice")
			}
			<-ctx.Done()
			ended <- ctx.Err()
			return ctx.Err()
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); campaign(ctx, tm) }()
	defer func() { cancel(); <-done }()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("never won the campaign")
	}
	e.Close()
	stopped := time.Now() // closing waits for the server's clients: the lease runs from here
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("lead ended with %v", err)
		}
		if took := time.Since(stopped); took > ttl+5*time.Second {
			t.Errorf("lead ran on %s after etcd stopped (lease TTL %s)", took, ttl)
		}
	case <-time.After(ttl + 15*time.Second):
		t.Fatal("lead still running long after the lease was lost")
	}
}

// TestCachedHintAsksEtcdOncePerTTL: many NOT_LEADER answers at once share one lookup of the
// leader's address, and a lookup after the TTL sees a new leader.
func TestCachedHintAsksEtcdOncePerTTL(t *testing.T) {
	var calls atomic.Int64
	leader := atomic.Value{}
	leader.Store("127.0.0.1:1")
	hint := cachedHint(time.Second, func() string {
		calls.Add(1)
		time.Sleep(5 * time.Millisecond) // an etcd round trip
		return leader.Load().(string)
	})
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := hint(); got != "127.0.0.1:1" {
				t.Errorf("hint %q", got)
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("200 answers asked etcd %d times; want once", n)
	}
	leader.Store("127.0.0.1:2")
	time.Sleep(1100 * time.Millisecond)
	if got := hint(); got != "127.0.0.1:2" || calls.Load() != 2 {
		t.Fatalf("after the TTL: hint %q after %d lookups; want the new leader after 2", got, calls.Load())
	}
}

// TestCachedHintServesStaleWhileRefreshing: once there is an answer, a slow lookup (etcd slow
// or gone) holds up no caller but the one making it; the others get the last answer.
func TestCachedHintServesStaleWhileRefreshing(t *testing.T) {
	var calls atomic.Int64
	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	defer letGo() // also on a failure, so no lookup hangs past the test
	hint := cachedHint(time.Millisecond, func() string {
		if calls.Add(1) == 1 {
			return "127.0.0.1:1"
		}
		<-release // the second lookup hangs until released
		return "127.0.0.1:2"
	})
	if got := hint(); got != "127.0.0.1:1" {
		t.Fatalf("first hint %q", got)
	}
	time.Sleep(5 * time.Millisecond) // past the ttl
	refreshed := make(chan string, 1)
	go func() { refreshed <- hint() }() // makes the hanging lookup
	for calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	served := make(chan string, 100)
	go func() {
		for range 100 {
			served <- hint()
		}
	}()
	for range 100 {
		select {
		case got := <-served:
			if got != "127.0.0.1:1" {
				t.Fatalf("hint during a slow lookup %q, want the last answer", got)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("a hint waited for another caller's slow lookup")
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d lookups, want 2: one at a time", n)
	}
	letGo()
	if got := <-refreshed; got != "127.0.0.1:2" {
		t.Fatalf("the refreshing caller got %q", got)
	}
	if got := hint(); got != "127.0.0.1:2" {
		t.Fatalf("hint after the refresh %q", got)
	}
}
