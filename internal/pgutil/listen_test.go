package pgutil_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
)

// Listen delivers, in order, every notification committed after ready and none before, also
// after quiet spells longer than its heartbeat; it stops with ctx's error; its connection
// leaves the pool and is closed, so no pooled connection is left listening, and nothing of it
// is kept.
func TestListen(t *testing.T) {
	defer pgutil.SetListenHeartbeat(100 * time.Millisecond)()
	pool, _ := testpg.NewPool(t, "listen", 2)
	starts := pgutil.BackendStarts()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	notify := func(p string) {
		if _, err := pool.Exec(context.Background(), `SELECT pg_notify('quota_test', $1)`, p); err != nil {
			t.Error(err)
		}
	}
	notify("before")
	got := make(chan string, 10)
	done := make(chan error, 1)
	go func() {
		done <- pgutil.Listen(ctx, pool, "quota_test", func() { notify("a") }, func(p string) { got <- p })
	}()
	for _, want := range []string{"a", "b", "c"} {
		if want != "a" {
			time.Sleep(350 * time.Millisecond) // three heartbeats, each a query answered
			notify(want)
		}
		select {
		case p := <-got:
			if p != want {
				t.Fatalf("got %q, want %q (nothing from before ready)", p, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no notification %q", want)
		}
	}
	if n := pool.Stat().TotalConns(); n != 1 {
		t.Fatalf("the pool holds %d connections while one listens; want only the notifier's", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen ended with %v, want context.Canceled", err)
	}
	if n := pgutil.BackendStarts(); n > starts {
		t.Fatalf("%d connections' starts recorded after Listen returned, %d before: the listener's is kept", n, starts)
	}
	listening := func() (n int) {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(5 * time.Second)
	for listening() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a connection still listens after Listen returned")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
