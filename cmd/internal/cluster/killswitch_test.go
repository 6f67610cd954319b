package cluster_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ksReserve asks region rc for one unit of sale's phone for a new buyer and returns the error.
func ksReserve(ctx context.Context, rc quotav1.RegionServiceClient, sale, user string) (*quotav1.ReserveResponse, error) {
	return rc.Reserve(ctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: user, Quantity: 1, RequestKey: "k-" + user})
}

// isPaused tells whether err is the kill switch's answer: FailedPrecondition, reason PAUSED.
func isPaused(err error) bool {
	return status.Code(err) == codes.FailedPrecondition && apierr.Reason(err) == "PAUSED"
}

// wantPausedAt asserts that a new hold of sale's phone at rc is refused PAUSED, with a message
// naming what is paused: the SKU and its sale, or (whole) the sale.
func wantPausedAt(t *testing.T, ctx context.Context, rc quotav1.RegionServiceClient, where, sale, user string, whole bool) {
	t.Helper()
	want := "sku phone of sale " + sale + " is paused"
	if whole {
		want = "sale " + sale + " is paused"
	}
	_, err := ksReserve(ctx, rc, sale, user)
	if !isPaused(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("reserve at %s while paused: %v (reason %q); want PAUSED saying %q", where, err, apierr.Reason(err), want)
	}
}

// latestHold is the creation time of the newest hold of sale in a region's database.
func latestHold(t *testing.T, ctx context.Context, dbURL, sale string) time.Time {
	t.Helper()
	db, err := pgutil.Open(ctx, dbURL, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var at time.Time
	if err := db.QueryRow(ctx, `SELECT max(created_at) FROM holds WHERE sale_id = $1`, sale).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// ksLoad runs cfg's buyers to the end (so no call is cut off by the run's end) and closes
// started once started buyers have begun. It returns the run's totals on a channel.
func ksLoad(t *testing.T, ctx context.Context, cfg loadgen.Config, started int64) (<-chan struct{}, <-chan loadgen.Stats) {
	ready, done := make(chan struct{}), make(chan loadgen.Stats, 1)
	var once sync.Once
	cfg.Creds, cfg.MaxDuration, cfg.ProgressEvery = creds(t, trust.Storefront), time.Minute, 20*time.Millisecond
	cfg.Progress = func(s loadgen.Stats) {
		if s.Buyers >= started {
			once.Do(func() { close(ready) })
		}
	}
	go func() {
		st, err := loadgen.Run(ctx, cfg)
		if err != nil {
			t.Error(err)
		}
		once.Do(func() { close(ready) })
		done <- st
	}()
	return ready, done
}

// pauseAll pauses sale's phone at the coordinator and checks that every region has it.
func pauseAll(t *testing.T, ctx context.Context, coord quotav1.CoordinatorServiceClient, sale string, regions int) time.Time {
	t.Helper()
	resp, err := coord.PauseSale(ctx, &quotav1.PauseSaleRequest{SaleId: sale, Sku: "phone", Reason: "test: kill switch"})
	returned := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetUnreached()) != 0 || len(resp.GetReached()) != regions {
		t.Fatalf("pause reached %v, not %v; want all %d regions", resp.GetReached(), resp.GetUnreached(), regions)
	}
	ps := resp.GetSale().GetPauses()
	if len(ps) != 1 || ps[0].GetSku() != "phone" || !ps[0].GetPaused() || len(ps[0].GetUndelivered()) != 0 {
		t.Fatalf("the sale's pauses after the pause: %v; want phone paused, delivered everywhere", ps)
	}
	return returned
}

// TestKillSwitchStopsALoadWithinASecond: buyers reserve and pay at two regions; the SKU is
// paused under the load. No hold is made at either region more than a second after the pause
// returns (none after it at all: each region has the pause before it answers), buyers are told
// PAUSED, and the holds granted before it are still paid for and released, the load's and
// two made by hand. Resuming restores sales, and the audit is clean.
func TestKillSwitchStopsALoadWithinASecond(t *testing.T) {
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, coord, "k", 400000)
	rcs := map[string]quotav1.RegionServiceClient{}
	early := map[string][]string{} // per region: a hold to pay and one to release while paused
	var regions []loadgen.Region
	for _, n := range d.Regions {
		name := n.R.Name()
		rcs[name] = quotav1.NewRegionServiceClient(dial(t, n.Addr(), trust.Storefront))
		regions = append(regions, loadgen.Region{Name: name, Addr: n.Addr(), Weight: 1})
		for _, u := range []string{"early-pay", "early-release"} {
			res, err := ksReserve(ctx, rcs[name], "k", u+"-"+name) // a buyer per region: each is bound to one
			if err != nil {
				t.Fatal(err)
			}
			early[name] = append(early[name], res.GetReservation().GetHoldId())
		}
	}
	ready, done := ksLoad(t, ctx, loadgen.Config{Sale: "k", SKU: "phone", Regions: regions, Buyers: 8000, Concurrency: 32,
		ConfirmRatio: 0.5, ReleaseRatio: 0.2, Seed: 3}, 3000)
	<-ready
	returned := pauseAll(t, ctx, coord, "k", 2)
	for name, rc := range rcs {
		if res, err := rc.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: early[name][0], PaymentId: "pay-early"}); err != nil ||
			res.GetOutcome() != quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD {
			t.Fatalf("confirm at %s while paused: %v, %v; want sold", name, res, err)
		}
		if _, err := rc.Release(ctx, &quotav1.ReleaseRequest{HoldId: early[name][1]}); err != nil {
			t.Fatalf("release at %s while paused: %v", name, err)
		}
		wantPausedAt(t, ctx, rc, name, "k", "late-"+name, false)
	}
	st := <-done
	t.Logf("load: %d buyers, %d granted, %d paused, %d confirmed, %d released, %d failed (%s)", st.Buyers, st.Granted, st.Paused,
		st.Confirmed, st.Released, st.Failed, st.FirstError)
	if st.Granted == 0 || st.Paused == 0 || st.Failed != 0 {
		t.Fatalf("load: %d granted, %d paused, %d failed (%s); want grants before the pause, PAUSED after, and no failed call (confirms and releases go on)",
			st.Granted, st.Paused, st.Failed, st.FirstError)
	}
	for _, n := range d.Regions {
		last := latestHold(t, ctx, d.DBURLs[n.R.Name()], "k")
		t.Logf("%s: newest hold made %s after the pause returned", n.R.Name(), last.Sub(returned))
		if last.After(returned.Add(time.Second)) {
			t.Fatalf("%s made a hold at %s, more than 1 s after the pause returned at %s", n.R.Name(), last, returned)
		}
	}
	if resp, err := coord.ResumeSale(ctx, &quotav1.ResumeSaleRequest{SaleId: "k"}); err != nil || len(resp.GetUnreached()) != 0 ||
		len(resp.GetSale().GetPauses()) != 0 {
		t.Fatalf("resume: %v, %v; want every region reached and nothing paused", resp, err)
	}
	for name, rc := range rcs {
		if _, err := ksReserve(ctx, rc, "k", "after-resume-"+name); err != nil {
			t.Fatalf("reserve at %s after the resume: %v", name, err)
		}
	}
	auditOK(t, coord, "k")
}

// ksRegion is one region "us" of several nodes on one database, with its etcd and a
// coordinator that follows its leader, and sale f (200,000 phones, all at us) created.
type ksRegion struct {
	etcd  *fencing.Client
	db    string
	coord quotav1.CoordinatorServiceClient
	start func(standbyRefresh time.Duration) *cluster.RegionNode
}

// newKSRegion starts the etcd and the coordinator, and the region's first node, a, which it
// waits to lead and returns.
func newKSRegion(t *testing.T, ctx context.Context, ttl time.Duration) (*ksRegion, *cluster.RegionNode) {
	t.Helper()
	e, err := fencing.StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	k := &ksRegion{db: testpg.NewDB(t, "killswitch")}
	if k.etcd, err = fencing.Dial([]string{e.ClientURL}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.etcd.Close() })
	k.start = func(refresh time.Duration) *cluster.RegionNode {
		n, err := cluster.StartRegion(ctx, cluster.RegionConfig{Region: region.Config{Name: "us", Verify: verify(), StandbyRefresh: refresh},
			Listen: "127.0.0.1:0", DBURL: k.db, LeaseTTL: ttl, TLS: certs, Logger: testLogger()}, k.etcd)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		return n
	}
	a := k.start(0)
	if err := a.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	coordNode, err := cluster.StartCoordinator(ctx, cluster.CoordinatorConfig{Listen: "127.0.0.1:0", DBURL: testpg.NewDB(t, "ledger"),
		Regions: []cluster.RegionEndpoint{{Name: "us", Addr: a.Addr(), DBURL: k.db}}, LeaseTTL: ttl, FollowLeaders: true, TLS: certs,
		Logger: testLogger()}, k.etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coordNode.Close)
	if err := coordNode.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	k.coord = quotav1.NewCoordinatorServiceClient(dial(t, coordNode.Addr(), trust.Operator))
	if _, err := k.coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "f", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 200000}},
		PerUserLimit: 2, HoldTtlMs: 600000}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "f", RequestId: "a", Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	return k, a
}

// TestKillSwitchHoldsAcrossFailoverAndRestart: a region of two nodes on one database, under
// load; the SKU is paused, then the leader is crashed (its lease left to expire). The standby
// takes over from its warm copy already paused: no hold is made after the pause returned,
// confirms and releases of earlier holds work there, and a new buyer is told PAUSED. That
// node is crashed too and a fresh cold node (no warm copy) takes over: still paused. Resume
// restores sales.
func TestKillSwitchHoldsAcrossFailoverAndRestart(t *testing.T) {
	const ttl = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, a := newKSRegion(t, ctx, ttl)
	b := k.start(0) // the standby, with a warm copy
	var early []string
	ra := quotav1.NewRegionServiceClient(dial(t, a.Addr(), trust.Storefront))
	for _, u := range []string{"pay-at-b", "release-at-b", "pay-at-c"} {
		res, err := ksReserve(ctx, ra, "f", u)
		if err != nil {
			t.Fatal(err)
		}
		early = append(early, res.GetReservation().GetHoldId())
	}
	resolve := func(ctx context.Context, _ string) string {
		addr, _, _ := fencing.Leader(ctx, k.etcd, "region/us")
		return addr
	}
	ready, done := ksLoad(t, ctx, loadgen.Config{Sale: "f", SKU: "phone", Regions: []loadgen.Region{{Name: "us", Addr: a.Addr(), Weight: 1}},
		Buyers: 12000, Concurrency: 32, ConfirmRatio: 0.5, Seed: 5, Resolve: resolve}, 3000)
	<-ready
	returned := pauseAll(t, ctx, k.coord, "f", 1)
	time.Sleep(300 * time.Millisecond)
	a.Crash()
	waitFor(t, "the standby to lead", ttl+3*time.Second, func() bool { return b.R.Leading() })
	if _, warm := b.R.Takeovers(); warm != 1 {
		t.Fatalf("the standby did not take over from its warm copy")
	}
	rb := quotav1.NewRegionServiceClient(dial(t, b.Addr(), trust.Storefront))
	wantPausedAt(t, ctx, rb, "the standby, after the failover", "f", "late-b", false)
	if res, err := rb.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: early[0], PaymentId: "pay"}); err != nil ||
		res.GetOutcome() != quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD {
		t.Fatalf("confirm after the failover while paused: %v, %v; want sold", res, err)
	}
	if _, err := rb.Release(ctx, &quotav1.ReleaseRequest{HoldId: early[1]}); err != nil {
		t.Fatalf("release after the failover while paused: %v", err)
	}
	st := <-done
	t.Logf("load: %d buyers, %d granted, %d paused, %d confirmed, %d failed (%s)", st.Buyers, st.Granted, st.Paused, st.Confirmed, st.Failed, st.FirstError)
	if st.Granted == 0 || st.Paused == 0 {
		t.Fatalf("load: %d granted, %d paused; want grants before the pause and PAUSED after", st.Granted, st.Paused)
	}
	last := latestHold(t, ctx, k.db, "f")
	t.Logf("newest hold made %s after the pause returned", last.Sub(returned))
	if last.After(returned.Add(time.Second)) {
		t.Fatalf("a hold made at %s, more than 1 s after the pause returned at %s", last, returned)
	}
	ksRestartCold(t, ctx, k, b, ttl, early[2])
}

// ksRestartCold crashes the leader b and checks that a fresh cold node (no warm copy: it loads
// everything) takes over still paused and confirms the hold to pay; then resumes the sale and
// checks that it sells, and that the audit is clean.
func ksRestartCold(t *testing.T, ctx context.Context, k *ksRegion, b *cluster.RegionNode, ttl time.Duration, toPay string) {
	t.Helper()
	c := k.start(-1) // a cold node: a takeover loads everything from the database
	b.Crash()
	waitFor(t, "the cold node to lead", ttl+5*time.Second, func() bool { return c.R.Leading() })
	if full, _ := c.R.Takeovers(); full != 1 {
		t.Fatal("the cold node did not load everything at its takeover")
	}
	rc := quotav1.NewRegionServiceClient(dial(t, c.Addr(), trust.Storefront))
	wantPausedAt(t, ctx, rc, "a cold node, after a restart", "f", "late-c", false)
	if res, err := rc.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: toPay, PaymentId: "pay"}); err != nil ||
		res.GetOutcome() != quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD {
		t.Fatalf("confirm after the restart while paused: %v, %v; want sold", res, err)
	}
	if resp, err := k.coord.ResumeSale(ctx, &quotav1.ResumeSaleRequest{SaleId: "f", Sku: "phone"}); err != nil || len(resp.GetUnreached()) != 0 {
		t.Fatalf("resume: %v, %v; want the region reached", resp, err)
	}
	if _, err := ksReserve(ctx, rc, "f", "after-resume"); err != nil {
		t.Fatalf("reserve after the resume: %v", err)
	}
	auditOK(t, k.coord, "f")
}

// TestPauseReachesACutOffRegionLater: a region the coordinator cannot reach is named in the
// pause's answer and in the sale's pauses (undelivered), and keeps selling meanwhile; once the
// link heals, the coordinator's retries pause it within seconds, unasked. A resume is
// delivered the same way.
func TestPauseReachesACutOffRegionLater(t *testing.T) {
	tc := newTestCluster(t, "us", "eu")
	coord := tc.coordinator(tc.addCoordinator(30 * time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := tc.coords[0].WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	createSale2(t, coord, "cut", 1000)
	tc.proxies["eu"].Cut()
	resp, err := coord.PauseSale(ctx, &quotav1.PauseSaleRequest{SaleId: "cut", Reason: "cut-off test"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetReached()) != 1 || resp.GetReached()[0] != "us" || len(resp.GetUnreached()) != 1 || resp.GetUnreached()[0].GetRegion() != "eu" {
		t.Fatalf("pause with eu cut off: reached %v, unreached %v; want us, and eu with its error", resp.GetReached(), resp.GetUnreached())
	}
	if ps := resp.GetSale().GetPauses(); len(ps) != 1 || ps[0].GetSku() != "" || strings.Join(ps[0].GetUndelivered(), ",") != "eu" {
		t.Fatalf("the sale's pauses: %v; want the whole sale paused, not yet at eu", ps)
	}
	wantPausedAt(t, ctx, tc.region("us"), "us", "cut", "u1", true)
	// us refused u1 PAUSED without binding them: eu may take them.
	if _, err := ksReserve(ctx, tc.region("eu"), "cut", "u1"); err != nil {
		t.Fatalf("eu, not reached, still sells (as documented): %v", err)
	}
	tc.proxies["eu"].Heal()
	polls := 0
	waitFor(t, "eu to be paused by the coordinator's retries", 15*time.Second, func() bool {
		polls++ // a new buyer each time: a retry of a granted reserve is answered with its hold
		_, err := ksReserve(ctx, tc.region("eu"), "cut", "poll"+itoa(polls))
		return isPaused(err)
	})
	// The ledger records the delivery once the region's answer is back, just after the region
	// has the pause: wait for it too.
	waitFor(t, "the ledger to record the pause delivered everywhere", 15*time.Second, func() bool {
		g, err := coord.GetSale(ctx, &quotav1.GetSaleRequest{SaleId: "cut"})
		return err == nil && len(g.GetSale().GetPauses()) == 1 && len(g.GetSale().GetPauses()[0].GetUndelivered()) == 0
	})
	tc.proxies["eu"].Cut()
	resumed, err := coord.ResumeSale(ctx, &quotav1.ResumeSaleRequest{SaleId: "cut"})
	if err != nil || len(resumed.GetUnreached()) != 1 {
		t.Fatalf("resume with eu cut off: %v, %v; want eu unreached", resumed, err)
	}
	if _, err := ksReserve(ctx, tc.region("us"), "cut", "u2"); err != nil {
		t.Fatalf("us after the resume: %v", err)
	}
	wantPausedAt(t, ctx, tc.region("eu"), "eu, the resume not delivered", "cut", "e2", true)
	tc.proxies["eu"].Heal()
	healed := time.Now()
	waitFor(t, "eu to be resumed by the coordinator's retries", 15*time.Second, func() bool {
		_, err := ksReserve(ctx, tc.region("eu"), "cut", "u3")
		return err == nil
	})
	t.Logf("eu resumed %s after the link healed", time.Since(healed).Round(time.Millisecond))
}

// syncBuffer is a log sink tests read while servers write to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestContinuousAuditPausesABreach: with a 1 s audit interval, a clean sale is never paused;
// once a region's stored pool is tampered with (a unit conjured, books still balanced), the
// coordinator pauses the SKU by itself within two audit periods: every region refuses it
// PAUSED, the evidence is logged at error level, and the audit and the sale show the pause
// with the evidence as its reason. An operator's resume does not stick while the breach lasts.
func TestContinuousAuditPausesABreach(t *testing.T) {
	const interval = time.Second
	logs := &syncBuffer{}
	prefix := "quota_t_" + randHex(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := cluster.StartDev(ctx, cluster.DevConfig{Regions: []string{"us", "eu"}, PGURL: testpg.AdminURL(), DBPrefix: prefix,
		DataDir: t.TempDir(), Host: "127.0.0.1", LeaseTTL: 2 * time.Second, AuditInterval: interval, CertsDir: certs.Dir(),
		// No QUOTA_VERIFY checks in the regions: the test tampers with a region's stored rows, which
		// those checks would (rightly) take for a bug of the process and crash on.
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})), Region: region.Config{Verify: false}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		dropDBs(t, prefix, []string{"us", "eu"})
	})
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, coord, "au", 1000)
	rcs := []quotav1.RegionServiceClient{}
	for _, n := range d.Regions {
		rcs = append(rcs, quotav1.NewRegionServiceClient(dial(t, n.Addr(), trust.Storefront)))
	}
	time.Sleep(2 * interval)
	for i, rc := range rcs {
		if _, err := ksReserve(ctx, rc, "au", "clean"+itoa(i)); err != nil {
			t.Fatalf("reserve of a clean sale under the continuous audit: %v", err)
		}
	}
	db, err := pgutil.Open(ctx, d.DBURLs["us"], 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `UPDATE pools SET available = available + 1, credited_in = credited_in + 1 WHERE sale_id = 'au'`); err != nil {
		t.Fatal(err)
	}
	tampered := time.Now()
	n := 0
	pausedEverywhere := func() bool {
		for _, rc := range rcs {
			n++
			if _, err := ksReserve(ctx, rc, "au", "poll"+itoa(n)); !isPaused(err) {
				return false
			}
		}
		return true
	}
	waitFor(t, "the audit to pause the SKU", 2*interval+time.Second, pausedEverywhere)
	took := time.Since(tampered)
	t.Logf("paused everywhere %s after the tampering (audit interval %s)", took.Round(time.Millisecond), interval)
	if took > 2*interval {
		t.Fatalf("paused %s after the tampering; want within two audit periods (%s)", took, 2*interval)
	}
	checkAuditPause(t, ctx, coord, logs.String())
	if _, err := coord.ResumeSale(ctx, &quotav1.ResumeSaleRequest{SaleId: "au"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the audit to pause the SKU again", 2*interval+time.Second, pausedEverywhere)
}

// checkAuditPause asserts that the audit and the sale show the continuous audit's pause of
// au's phone, with the I1 evidence as its reason, and that the evidence was logged at error
// level.
func checkAuditPause(t *testing.T, ctx context.Context, coord quotav1.CoordinatorServiceClient, logs string) {
	t.Helper()
	a, err := coord.Audit(ctx, &quotav1.AuditRequest{SaleId: "au"})
	if err != nil {
		t.Fatal(err)
	}
	if a.GetOk() || len(a.GetPauses()) != 1 || a.GetPauses()[0].GetSku() != "phone" ||
		!strings.HasPrefix(a.GetPauses()[0].GetReason(), "audit: I1 violation: total 1000 != ") {
		t.Fatalf("audit after the tampering: ok %v, pauses %v; want the violation and the audit's pause of phone with its evidence", a.GetOk(), a.GetPauses())
	}
	g, err := coord.GetSale(ctx, &quotav1.GetSaleRequest{SaleId: "au"})
	if err != nil || len(g.GetSale().GetPauses()) != 1 || g.GetSale().GetPauses()[0].GetReason() != a.GetPauses()[0].GetReason() {
		t.Fatalf("the sale: %v, %v; want the audit's pause", g, err)
	}
	if !strings.Contains(logs, `"level":"ERROR","msg":"continuous audit: conservation (I1) broken; pausing the SKU in every region"`) ||
		!strings.Contains(logs, `"evidence":"total 1000 != unallocated 0 + available`) {
		t.Fatalf("no error-level log of the breach with its evidence:\n%s", logs)
	}
}
