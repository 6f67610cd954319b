package local_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
)

// regionSplitBrain is a split brain on real processes, at region r of c (started with a 2 s
// lease; a subtest of TestLocalRegionFaults): whichever of r's two processes leads is paused
// (SIGSTOP) past its lease while buyers keep coming, the other, standing by, takes over and
// serves, and then the old leader is resumed with whatever it had queued. It stops
// leading; nothing it held is answered as a success that is not in the books (the epoch fence
// refuses its batches: their callers are told NOT_LEADER and follow the new leader); every
// acknowledged hold is at the new leader, and the audit is clean. A buyer at r's storefront
// edge (edge-r, started for it) is served while the old leader is still paused: the edge
// finds the frozen process frozen (its liveness check goes unanswered) and moves on.
func regionSplitBrain(t *testing.T, c *localCluster, r string) {
	const (
		ttl       = regionFaultTTL
		loadTime  = 20 * time.Second
		pauseAt   = 5 * time.Second
		pausedFor = ttl + 6*time.Second
		sale      = "sb"
		// epochWait is region.epochWait: how long a successor waits for a stalled
		// predecessor's transaction on the epoch row before ending it.
		epochWait = 2 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader, _, primary, standby := c.regionProcs(t, r)
	coord := c.addr(0)
	if out, err := c.quotactl(coord, "sale", "create", "--sale", sale, "--sku", "phone=40000", "--per-user-limit", "2",
		"--hold-ttl", "10m", "--allocate", r+"=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	c.startEdgeServing(t, ctx, r, sale)
	conn, err := grpc.NewClient(standby, grpc.WithTransportCredentials(c.creds(trust.Storefront)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rs := quotav1.NewRegionServiceClient(conn)

	load := c.startLoad(ctx, loadgen.Config{Sale: sale, SKU: "phone", Regions: []loadgen.Region{{Name: r, Addr: primary, Weight: 1}},
		Buyers: 1_000_000, Concurrency: 64, ConfirmRatio: 0.5, UserPrefix: "sb-", MaxDuration: loadTime, Seed: 5})
	time.Sleep(pauseAt)

	c.cluster(30*time.Second, "pause", leader)
	paused := time.Now()
	edgeServed := c.probeEdge(ctx, r, sale, "during", paused.Add(pausedFor))
	var took time.Duration
	for probes := 0; ; probes++ {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		_, err := rs.Reserve(cctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "probe-sb", Quantity: 1, RequestKey: "k"})
		ccancel()
		if err == nil {
			took = time.Since(paused)
			break
		}
		if time.Since(paused) > ttl+30*time.Second {
			t.Fatalf("the standby does not serve %s after the leader was paused (%d probes): %v (%s)",
				time.Since(paused).Round(time.Millisecond), probes, err, apierr.Reason(err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("SPLIT BRAIN: the standby served %s after the leader was paused (lease TTL %s)", took.Round(time.Millisecond), ttl)
	// A killed leader's standby serves within the TTL + 2 s; a paused leader may also hold
	// the epoch row for epochWait, and a loaded machine adds its own delays.
	if took > ttl+2*time.Second+epochWait+5*time.Second {
		t.Errorf("the standby served after %s; want within the lease TTL + 2 s + %s (+ 5 s of slack)", took.Round(time.Millisecond), epochWait)
	}
	time.Sleep(time.Until(paused.Add(pausedFor)))
	checkEdgeDuringPause(t, r, <-edgeServed, ttl, pausedFor)
	c.cluster(30*time.Second, "resume", leader)
	c.oldLeaderRefers(t, ctx, primary, standby, sale)
	ls := load.wait(t, loadTime+30*time.Second)
	c.lookupHolds(ls.Holds).check(t, ls.Confirmed)
	c.auditSale(t, sale)
	oldLeaderSteppedDown(t, c, leader)
}

// regionProcs is region r's two processes as status shows them now: the one that leads and
// the one that stands by, and their addresses. Either may lead: a region that failed over
// before (its leader killed, or its lease lost while etcd was paused) is led by the other.
func (c *localCluster) regionProcs(t *testing.T, r string) (leader, standby, leaderAddr, standbyAddr string) {
	t.Helper()
	i := regionIndex(t, r)
	leader, standby, leaderAddr, standbyAddr = "region-"+r, "region-"+r+"-2", c.addr(1+i), c.addr(11+i)
	st := c.status()
	if strings.Contains(st[standby], "leader") {
		leader, standby, leaderAddr, standbyAddr = standby, leader, standbyAddr, leaderAddr
	}
	if !strings.Contains(st[leader], "leader") || !strings.Contains(st[standby], "standby") {
		t.Fatalf("want one of region %s's processes leading and the other standing by: %s %q, %s %q", r, leader, st[leader], standby, st[standby])
	}
	t.Logf("%s leads region %s, %s stands by", leader, r, standby)
	return leader, standby, leaderAddr, standbyAddr
}

// regionIndex is r's place in the script's regions (us, eu, ap): its processes' ports are the
// base + 1 + index (the primary) and + 11 + index (the standby).
func regionIndex(t *testing.T, r string) int {
	t.Helper()
	for i, name := range []string{"us", "eu", "ap"} {
		if name == r {
			return i
		}
	}
	t.Fatalf("region %q: not one of the script's us, eu, ap", r)
	return -1
}

// edgeLiveness is how long an edge takes at most to find a frozen process frozen: its
// liveness check and probe (regionedge.DefaultLivenessCheck and DefaultLivenessProbe).
const edgeLiveness = 2 * time.Second

// startEdgeServing starts region r's storefront edge edge-r (the cluster is up without them)
// and has it serve a buyer of sale: it then holds a connection to the leader, as an edge in a
// sale does, rather than dial a frozen process afresh.
func (c *localCluster) startEdgeServing(t *testing.T, ctx context.Context, r, sale string) {
	t.Helper()
	c.cluster(time.Minute, "start", "edge-"+r)
	if d := <-c.probeEdge(ctx, r, sale, "before", time.Now().Add(10*time.Second)); d == 0 {
		t.Fatalf("no buyer was served at %s's storefront edge before the pause", r)
	}
}

// checkEdgeDuringPause checks that a buyer at region r's storefront edge was served d after
// r's leader was paused for pausedFor (0: never): the edge finds the leader frozen (its
// liveness check goes unanswered) and moves on to the new leader, within the lease ttl, the
// check and 2 s.
func checkEdgeDuringPause(t *testing.T, r string, d, ttl, pausedFor time.Duration) {
	t.Helper()
	switch {
	case d == 0:
		t.Errorf("no buyer was served at %s's storefront edges in the %s its leader was paused", r, pausedFor)
	case d > ttl+edgeLiveness+2*time.Second:
		t.Errorf("a buyer at the storefront edges was served %s after the leader was paused; want within the lease (%s), the edge's liveness check (%s) and 2 s",
			d.Round(time.Millisecond), ttl, edgeLiveness)
	default:
		t.Logf("SPLIT BRAIN: a buyer at the storefront edges was served %s after the leader was paused", d.Round(time.Millisecond))
	}
}

// probeEdge sends buyer user's reservation to region r's storefront edges every 100 ms until
// one is answered with a hold or until, and reports on the channel how long after the start
// that was (0: never).
func (c *localCluster) probeEdge(ctx context.Context, r, sale, user string, until time.Time) <-chan time.Duration {
	c.t.Helper()
	hc := c.storefrontClient(2, 8*time.Second) // a patient buyer: the edge, not the buyer, must give up on the frozen leader
	u := c.storefrontOf(r) + "/v1/sales/" + sale + "/reservations"
	out := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		for time.Now().Before(until) && ctx.Err() == nil {
			a, err := edgeDo(ctx, hc, http.MethodPost, u, map[string]any{"user_id": "probe-sb-edge-" + user, "sku": "phone",
				"quantity": 1, "request_key": "k-edge"})
			if err == nil && a.code/100 == 2 {
				out <- time.Since(start)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		out <- 0
	}()
	return out
}

// oldLeaderRefers checks that the resumed old leader at primary, asked directly, does not
// grant: it answers NOT_LEADER naming the new leader, standby (it may first answer with the
// outcome of what it had queued).
func (c *localCluster) oldLeaderRefers(t *testing.T, ctx context.Context, primary, standby, sale string) {
	t.Helper()
	oldConn, err := grpc.NewClient(primary, grpc.WithTransportCredentials(c.creds(trust.Storefront)))
	if err != nil {
		t.Fatal(err)
	}
	defer oldConn.Close()
	oldRS := quotav1.NewRegionServiceClient(oldConn)
	c.eventually(20*time.Second, "the resumed old leader answers NOT_LEADER naming the new one", func() error {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		res, err := oldRS.Reserve(cctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "probe-old", Quantity: 1, RequestKey: "k"})
		if err == nil {
			t.Errorf("the resumed old leader granted hold %s", res.GetReservation().GetHoldId())
			return nil
		}
		if apierr.Reason(err) != "NOT_LEADER" || apierr.LeaderHint(err) != standby {
			return fmt.Errorf("%v (%s, leader %q)", err, apierr.Reason(err), apierr.LeaderHint(err))
		}
		return nil
	})
}

// oldLeaderSteppedDown checks, from process leader's log, what it did once resumed: it
// stepped down; any batch it still tried met the epoch fence.
func oldLeaderSteppedDown(t *testing.T, c *localCluster, leader string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, leader+".log"))
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "fenced") || strings.Contains(line, "stepped down") || strings.Contains(line, "batch failed") {
			seen = append(seen, line)
		}
	}
	t.Logf("the old leader after resuming:\n%s", strings.Join(seen, "\n"))
	if !strings.Contains(string(b), "stepped down") {
		t.Error("the old leader's log does not say it stepped down")
	}
}
