package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/trust"
)

// startBindEtcd starts an embedded etcd for the test and returns its client URL.
func startBindEtcd(t testing.TB) string {
	t.Helper()
	e, err := fencing.StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e.ClientURL
}

func dialBind(t testing.TB, url string) *fencing.Client {
	t.Helper()
	c, err := fencing.Dial([]string{url}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawEtcd is a plain etcd client, to look at records the way etcd sees them.
func rawEtcd(t testing.TB, url string) *clientv3.Client {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

// recordLease is the lease the bind record of sale/user carries (0 for none).
func recordLease(t *testing.T, raw *clientv3.Client, sale, user string) clientv3.LeaseID {
	t.Helper()
	resp, err := raw.Get(context.Background(), "/quota/bind/"+sale+"|"+user)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("%s/%s: %d records, want 1", sale, user, len(resp.Kvs))
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// TestBindFirstRegionWins: the first region to bind a buyer is recorded; a later bind from
// another region gets that region back and changes nothing; Bound reads it.
func TestBindFirstRegionWins(t *testing.T) {
	ctx := context.Background()
	c := dialBind(t, startBindEtcd(t))
	b := fencing.NewBinder(c, time.Hour)
	defer b.Close()

	if _, ok, err := b.Bound(ctx, "s1", "alice"); err != nil || ok {
		t.Fatalf("Bound before any bind = %v, %v; want false, nil", ok, err)
	}
	if got, err := b.Bind(ctx, "s1", "alice", "us"); err != nil || got != "us" {
		t.Fatalf("first Bind = %q, %v; want us", got, err)
	}
	if got, err := b.Bind(ctx, "s1", "alice", "eu"); err != nil || got != "us" {
		t.Fatalf("Bind at eu = %q, %v; want us (the first)", got, err)
	}
	if got, err := fencing.Bind(ctx, c, "s1", "alice", "ap", fencing.NoLease); err != nil || got != "us" {
		t.Fatalf("fencing.Bind at ap = %q, %v; want us", got, err)
	}
	if got, ok, err := b.Bound(ctx, "s1", "alice"); err != nil || !ok || got != "us" {
		t.Fatalf("Bound = %q, %v, %v; want us, true", got, ok, err)
	}
	// Another sale, another user: records of their own.
	if got, err := b.Bind(ctx, "s2", "alice", "eu"); err != nil || got != "eu" {
		t.Fatalf("Bind s2/alice = %q, %v; want eu", got, err)
	}
	if got, err := b.Bind(ctx, "s1", "bob", "eu"); err != nil || got != "eu" {
		t.Fatalf("Bind s1/bob = %q, %v; want eu", got, err)
	}
}

// TestBindRefusesBadIDs: ids that could collide in the key ('|') and bad regions are refused
// as invalid, naming the field, before etcd is asked.
func TestBindRefusesBadIDs(t *testing.T) {
	c := dialBind(t, startBindEtcd(t))
	b := fencing.NewBinder(c, time.Hour)
	defer b.Close()
	for _, tc := range []struct{ sale, user, region, field string }{
		{"s|1", "alice", "us", "sale"},
		{"s1", "al|ice", "us", "user"},
		{"", "alice", "us", "sale"},
		{"s1", "", "us", "user"},
		{"s1", "alice", "", "region"},
		{"s1", "alice", "US", "region"},
	} {
		_, err := b.Bind(context.Background(), tc.sale, tc.user, tc.region)
		var inv *apierr.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("Bind(%q, %q, %q) = %v; want invalid %s", tc.sale, tc.user, tc.region, err, tc.field)
		}
	}
}

// TestBindConcurrentRegionsAgree: three regions binding the same buyers at once all get the
// same region back for each buyer, and it is one of theirs.
func TestBindConcurrentRegionsAgree(t *testing.T) {
	url := startBindEtcd(t)
	regions := []string{"us", "eu", "ap"}
	const users = 50
	got := make([][]string, len(regions))
	var wg sync.WaitGroup
	errs := make(chan error, len(regions))
	for r, region := range regions {
		b := fencing.NewBinder(dialBind(t, url), time.Hour)
		defer b.Close()
		got[r] = make([]string, users)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range users {
				bound, err := b.Bind(context.Background(), "sale", fmt.Sprintf("u%d", u), region)
				if err != nil {
					errs <- err
					return
				}
				got[r][u] = bound
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for u := range users {
		if got[0][u] != got[1][u] || got[1][u] != got[2][u] || !slices.Contains(regions, got[0][u]) {
			t.Errorf("u%d: regions answered %q, %q, %q; want one region of theirs", u, got[0][u], got[1][u], got[2][u])
		}
	}
}

// TestBinderBatchesConcurrentBinds: 200 binds at once, of two sales, a quarter of whose
// buyers are bound elsewhere already, go to etcd in far fewer transactions than binds; each
// bound buyer hears the region recorded, untouched, and every other is bound here, on its
// sale's lease.
func TestBinderBatchesConcurrentBinds(t *testing.T) {
	ctx := context.Background()
	url := startBindEtcd(t)
	c := dialBind(t, url)
	raw := rawEtcd(t, url)
	b := fencing.NewBinder(c, time.Hour)
	defer b.Close()
	const n = 200
	sale := func(u int) string { return fmt.Sprint("s", u%2) }
	for u := 0; u < n; u += 4 {
		if _, err := fencing.Bind(ctx, c, sale(u), fmt.Sprint("u", u), "eu", fencing.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"s0", "s1"} { // grant the leases first: binds then arrive at once
		if _, err := b.Bind(ctx, s, "warm", "us"); err != nil {
			t.Fatal(err)
		}
	}
	txns0 := b.Txns()
	got := make([]string, n)
	var wg sync.WaitGroup
	for u := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			bound, err := b.Bind(bctx, sale(u), fmt.Sprint("u", u), "us")
			if err != nil {
				t.Error(err)
			}
			got[u] = bound
		}()
	}
	wg.Wait()
	if txns := b.Txns() - txns0; txns > n/10 {
		t.Errorf("%d binds took %d etcd transactions; want them batched (at most %d)", n, txns, n/10)
	} else {
		t.Logf("%d binds in %d etcd transactions", n, txns)
	}
	leases := map[string]clientv3.LeaseID{"s0": recordLease(t, raw, "s0", "warm"), "s1": recordLease(t, raw, "s1", "warm")}
	for u := range n {
		want, lease := "us", leases[sale(u)]
		if u%4 == 0 {
			want, lease = "eu", 0
		}
		if got[u] != want {
			t.Errorf("u%d: bound to %q; want %s", u, got[u], want)
		}
		if l := recordLease(t, raw, sale(u), fmt.Sprint("u", u)); l != lease {
			t.Errorf("u%d: record on lease %x; want %x", u, l, lease)
		}
	}
}

// TestBindersOfTwoRegionsAgreeInBatches: two regions' Binders binding the same 300 buyers
// at once, each in batches, answer one region per buyer, the one etcd records.
func TestBindersOfTwoRegionsAgreeInBatches(t *testing.T) {
	ctx := context.Background()
	url := startBindEtcd(t)
	c := dialBind(t, url)
	regions := []string{"us", "eu"}
	const n = 300
	binders := make([]*fencing.Binder, len(regions))
	got := make([][]string, len(regions))
	for r := range regions {
		binders[r] = fencing.NewBinder(dialBind(t, url), time.Hour)
		defer binders[r].Close()
		got[r] = make([]string, n)
	}
	var wg sync.WaitGroup
	for u := range n {
		for r, region := range regions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				bound, err := binders[r].Bind(bctx, "sale", fmt.Sprint("u", u), region)
				if err != nil {
					t.Error(err)
				}
				got[r][u] = bound
			}()
		}
	}
	wg.Wait()
	wins := map[string]int{}
	for u := range n {
		rec, ok, err := fencing.Bound(ctx, c, "sale", fmt.Sprint("u", u))
		if err != nil || !ok {
			t.Fatalf("u%d: no record (%v)", u, err)
		}
		if got[0][u] != rec || got[1][u] != rec {
			t.Errorf("u%d: us answered %q, eu %q, etcd records %q; want one region", u, got[0][u], got[1][u], rec)
		}
		wins[rec]++
	}
	for r := range regions {
		if txns := binders[r].Txns(); txns >= n/2 {
			t.Errorf("%s: %d binds took %d etcd transactions; want them batched", regions[r], n, txns)
		}
	}
	t.Logf("bound: %v; transactions: us %d, eu %d", wins, binders[0].Txns(), binders[1].Txns())
}

// TestBindRecordsCarryTheSaleLease: a sale's first records carry one lease, granted once with a
// TTL of at least the retention; a sale of its own gets a lease of its own.
func TestBindRecordsCarryTheSaleLease(t *testing.T) {
	ctx := context.Background()
	url := startBindEtcd(t)
	raw := rawEtcd(t, url)
	b := fencing.NewBinder(dialBind(t, url), time.Hour)
	defer b.Close()
	for _, u := range []string{"a", "b", "c"} {
		if _, err := b.Bind(ctx, "s1", u, "us"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Bind(ctx, "s2", "a", "us"); err != nil {
		t.Fatal(err)
	}
	l := recordLease(t, raw, "s1", "a")
	if l == 0 {
		t.Fatal("record carries no lease")
	}
	for _, u := range []string{"b", "c"} {
		if lu := recordLease(t, raw, "s1", u); lu != l {
			t.Errorf("s1/%s carries lease %x, s1/a %x; want one lease per sale", u, lu, l)
		}
	}
	if l2 := recordLease(t, raw, "s2", "a"); l2 == l || l2 == 0 {
		t.Errorf("s2/a carries lease %x, s1 %x; want a lease of its own", l2, l)
	}
	ttl, err := raw.TimeToLive(ctx, l, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL < int64(time.Hour/time.Second) || ttl.GrantedTTL > int64(2*time.Hour/time.Second) {
		t.Errorf("lease TTL %ds (granted %ds); want between the retention (3600s) and twice it", ttl.TTL, ttl.GrantedTTL)
	}
	if len(ttl.Keys) != 3 {
		t.Errorf("lease holds %d keys, want s1's 3", len(ttl.Keys))
	}
}

// TestBindRecordsGoWithTheirLease: once a sale's lease ends its records go, and a Binder
// whose lease was revoked behind its back grants a new one and binds again.
func TestBindRecordsGoWithTheirLease(t *testing.T) {
	ctx := context.Background()
	url := startBindEtcd(t)
	raw := rawEtcd(t, url)
	b := fencing.NewBinder(dialBind(t, url), time.Hour)
	defer b.Close()
	if _, err := b.Bind(ctx, "s1", "alice", "us"); err != nil {
		t.Fatal(err)
	}
	l := recordLease(t, raw, "s1", "alice")
	if _, err := raw.Revoke(ctx, l); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.Bound(ctx, "s1", "alice"); err != nil || ok {
		t.Fatalf("Bound after the lease ended = %v, %v; want false", ok, err)
	}
	if got, err := b.Bind(ctx, "s1", "bob", "eu"); err != nil || got != "eu" {
		t.Fatalf("Bind after the lease was revoked = %q, %v; want eu", got, err)
	}
	if nl := recordLease(t, raw, "s1", "bob"); nl == 0 || nl == l {
		t.Fatalf("new record carries lease %x; want a new one (old %x)", nl, l)
	}
}

// TestBinderForgetsLeastRecentlyUsedSale: the Binder remembers at most MaxBindLeases sales'
// leases; a sale it forgot gets a new lease on its next bind.
func TestBinderForgetsLeastRecentlyUsedSale(t *testing.T) {
	if testing.Short() {
		t.Skip("binds in MaxBindLeases+1 sales")
	}
	ctx := context.Background()
	url := startBindEtcd(t)
	raw := rawEtcd(t, url)
	b := fencing.NewBinder(dialBind(t, url), time.Hour)
	defer b.Close()
	for i := range fencing.MaxBindLeases + 1 {
		if _, err := b.Bind(ctx, fmt.Sprintf("s%d", i), "a", "us"); err != nil {
			t.Fatal(err)
		}
	}
	// s0 is the least recently used: forgotten. s1024 is remembered.
	for _, sale := range []string{"s0", fmt.Sprint("s", fencing.MaxBindLeases)} {
		if _, err := b.Bind(ctx, sale, "b", "us"); err != nil {
			t.Fatal(err)
		}
	}
	if a, bl := recordLease(t, raw, "s0", "a"), recordLease(t, raw, "s0", "b"); a == bl {
		t.Errorf("s0 kept lease %x after %d other sales; want it forgotten", a, fencing.MaxBindLeases)
	}
	last := fmt.Sprint("s", fencing.MaxBindLeases)
	if a, bl := recordLease(t, raw, last, "a"), recordLease(t, raw, last, "b"); a != bl {
		t.Errorf("%s: leases %x and %x; want the remembered one", last, a, bl)
	}
}

// TestBinderCloseIsIdempotentAndLeaksNothing: Close twice is fine, calls after it fail with
// ErrBinderClosed, records stay (Close revokes no lease), and no goroutine is left behind.
func TestBinderCloseIsIdempotentAndLeaksNothing(t *testing.T) {
	ctx := context.Background()
	url := startBindEtcd(t)
	// The member's own goroutines are not the Binder's: some (its gRPC gateway's connection)
	// start only after it is ready, so wait for them before taking the baseline.
	warm := dialBind(t, url)
	warm.Close()
	settleGoroutines()
	ignore := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/embed.(*serveCtx).startHandler.func1"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver.(*EtcdServer).GoAttach.func1")}
	c, err := fencing.Dial([]string{url}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b := fencing.NewBinder(c, time.Hour)
	var wg sync.WaitGroup
	for r, region := range []string{"us", "eu", "ap"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range 20 {
				if _, err := b.Bind(ctx, fmt.Sprintf("s%d", u%3), fmt.Sprintf("r%du%d", r, u), region); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := b.Bind(ctx, "s0", "late", "us"); !errors.Is(err, fencing.ErrBinderClosed) {
		t.Fatalf("Bind after Close = %v; want ErrBinderClosed", err)
	}
	if _, _, err := b.Bound(ctx, "s0", "r0u0"); !errors.Is(err, fencing.ErrBinderClosed) {
		t.Fatalf("Bound after Close = %v; want ErrBinderClosed", err)
	}
	if got, ok, err := fencing.Bound(ctx, c, "s0", "r0u0"); err != nil || !ok || got != "us" {
		t.Fatalf("record after Close = %q, %v, %v; want us, kept", got, ok, err)
	}
	c.Close()
	goleak.VerifyNone(t, ignore...)
}

// settleGoroutines waits (up to 5 s) until the number of goroutines stays the same for 250 ms.
func settleGoroutines() {
	n, same := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(5 * time.Second); same < 5 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if m := runtime.NumGoroutine(); m == n {
			same++
		} else {
			n, same = m, 0
		}
	}
}

// BenchmarkBind measures binds/s with three regions binding distinct buyers at once, each
// region through its own connection with 64 callers, as three regions' admission would. It
// does at most 30,000 binds (b.N, capped) and stops after 20 s. Run it with
//
//	go test -run '^$' -bench BenchmarkBind -benchtime 20000x ./fencing/
//
// members=1 is the embedded single member tests use; members=3 a three-member cluster (as
// deploy/local runs), all on this machine's one disk; members=1,auth the single member with
// TLS and authentication on, each region binding as its own etcd user, as quotad dev runs.
func BenchmarkBind(b *testing.B) {
	b.Run("members=1", func(b *testing.B) {
		url := startBindEtcd(b)
		benchBind(b, url, func(string) *fencing.Client { return dialBind(b, url) })
	})
	b.Run("members=3", func(b *testing.B) {
		urls := startBindCluster(b)
		benchBind(b, urls[0], func(string) *fencing.Client {
			c, err := fencing.Dial(urls, 5*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			return c
		})
	})
	b.Run("members=1,auth", func(b *testing.B) {
		e := startAuthEtcd(b, "us", "eu", "ap")
		benchBind(b, "", func(region string) *fencing.Client { return e.dial(b, trust.EtcdRegion(region)) })
	})
}

// benchBind runs the benchmark with each region's client from dial; metricsURL, when set, is
// the member whose WAL fsyncs are reported.
func benchBind(b *testing.B, metricsURL string, dial func(region string) *fencing.Client) {
	const callers, maxBinds, maxTime = 64, 30000, 20 * time.Second
	regions := []string{"us", "eu", "ap"}
	n := int64(min(b.N, maxBinds))
	binders := make([]*fencing.Binder, len(regions))
	for r := range regions {
		binders[r] = fencing.NewBinder(dial(regions[r]), fencing.DefaultBindRetention)
		if _, err := binders[r].Bind(context.Background(), "bench", "warm-"+regions[r], regions[r]); err != nil {
			b.Fatal(err) // grants the sale's lease and warms the connection
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), maxTime)
	defer cancel()
	var next, done atomic.Int64
	lat := make([][]time.Duration, len(regions)*callers)
	var wg sync.WaitGroup
	var fsync0 fsyncs
	if metricsURL != "" {
		fsync0 = walFsync(b, metricsURL)
	}
	b.ResetTimer()
	cpu0 := cpuSeconds()
	start := time.Now()
	for w := range len(regions) * callers {
		r := w % len(regions)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= n && ctx.Err() == nil; i = next.Add(1) {
				t0 := time.Now()
				if _, err := binders[r].Bind(ctx, "bench", fmt.Sprintf("u%d", i), regions[r]); err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1 := cpuSeconds()
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		b.Fatal("no bind completed")
	}
	b.ReportMetric(float64(done.Load())/elapsed.Seconds(), "binds/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	fsync1 := fsync0
	if metricsURL != "" {
		fsync1 = walFsync(b, metricsURL)
	}
	if fsync1.count > fsync0.count {
		b.ReportMetric(1000*(fsync1.sum-fsync0.sum)/(fsync1.count-fsync0.count), "wal-fsync-ms")
		b.ReportMetric(float64(done.Load())/(fsync1.count-fsync0.count), "binds/fsync")
	}
	if cpu0 >= 0 && cpu1 >= 0 {
		b.ReportMetric((cpu1-cpu0)/elapsed.Seconds(), "cpu-cores") // of runtime.NumCPU()
	}
}

// cpuSeconds is the CPU time (user and system) this process has used so far, from
// /proc/self/stat in clock ticks of 1/100 s, or -1 where there is no /proc. The etcd members
// run in this process, so it counts theirs and the callers'.
func cpuSeconds() float64 {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return -1
	}
	_, rest, _ := strings.Cut(string(stat), ") ") // the command may contain spaces
	f := strings.Fields(rest)
	if len(f) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return (utime + stime) / 100
}

// fsyncs is etcd's WAL fsync histogram: how many, and their total seconds.
type fsyncs struct{ count, sum float64 }

// walFsync reads the WAL fsync histogram from the member's /metrics (in this process every
// member counts into one registry, so with three members it sums theirs).
func walFsync(b *testing.B, url string) fsyncs {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	var f fsyncs
	for _, line := range strings.Split(string(body), "\n") {
		name, val, _ := strings.Cut(line, " ")
		switch name {
		case "etcd_disk_wal_fsync_duration_seconds_count":
			f.count, _ = strconv.ParseFloat(val, 64)
		case "etcd_disk_wal_fsync_duration_seconds_sum":
			f.sum, _ = strconv.ParseFloat(val, 64)
		}
	}
	return f
}

// startBindCluster starts a three-member etcd cluster in this process and returns its
// client URLs.
func startBindCluster(b *testing.B) []string {
	names := []string{"e1", "e2", "e3"}
	clients, peers, initial := make([]string, 3), make([]string, 3), make([]string, 3)
	for i, name := range names {
		clients[i], peers[i] = testnet.URL(b), testnet.URL(b)
		initial[i] = name + "=" + peers[i]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, len(names))
	for i, name := range names {
		go func() {
			m, err := fencing.StartMember(ctx, fencing.MemberConfig{Name: name, Dir: b.TempDir(),
				ClientURL: clients[i], PeerURL: peers[i], InitialCluster: strings.Join(initial, ","), LogLevel: "error"})
			if err == nil {
				b.Cleanup(m.Close)
			}
			errs <- err
		}()
	}
	for range names {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return clients
}

// TestFollowBindingsAndUnbind: every binding there is, over several pages, then each one
// written later; Unbind removes a binding only while it names the region given.
func TestFollowBindingsAndUnbind(t *testing.T) {
	c := dialBind(t, startBindEtcd(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 2500 // more than two pages
	for i := range n {
		if _, err := fencing.Bind(ctx, c, "s", fmt.Sprintf("u%04d", i), "us", fencing.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(chan [3]string, n+10)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- fencing.FollowBindings(fctx, c, func(sale, user, region string) { seen <- [3]string{sale, user, region} })
	}()
	recv := func() [3]string {
		select {
		case b := <-seen:
			return b
		case <-time.After(20 * time.Second):
			t.Fatalf("no binding followed in 20 s")
			return [3]string{}
		}
	}
	got := map[string]bool{}
	for len(got) < n {
		b := recv()
		if b[0] != "s" || b[2] != "us" || got[b[1]] {
			t.Fatalf("binding %v: want each of s's once, at us", b)
		}
		got[b[1]] = true
	}
	if _, err := fencing.Bind(ctx, c, "s", "late", "mars", fencing.NoLease); err != nil {
		t.Fatal(err)
	}
	if b := recv(); b != [3]string{"s", "late", "mars"} {
		t.Fatalf("the binding written later: %v", b)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("FollowBindings after its context ended: %v", err)
	}
	for _, tc := range []struct {
		region string
		want   bool
	}{{"eu", false}, {"mars", true}, {"mars", false}} {
		if removed, err := fencing.Unbind(ctx, c, "s", "late", tc.region); err != nil || removed != tc.want {
			t.Errorf("unbind late from %s: %v, %v; want removed %v", tc.region, removed, err, tc.want)
		}
	}
}
