package local_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// regionFaultTTL is the lease of the cluster TestLocalRegionFaults's subtests share.
const regionFaultTTL = 2 * time.Second

// TestLocalRegionFaults is quotactl status and a region leader's two faults on real processes,
// on one cluster with a 2 s lease and QUOTA_STRAND_AFTER=2s (one `up` instead of one each):
// first localStatus, which wants the cluster as `up` left it (each fault it makes is named by
// quotactl status, then mended, and every region has a leader and a standby again); then kill
// -9 of ap's leader under load (regionKill9), the region status neither kills nor cuts off; then
// a split brain at us (regionSplitBrain). A region's lead may have moved to its other process
// before (status kills region-us; a lease may lapse while etcd3 is paused), so each fault
// subtest asks status which process leads and which stands by (regionProcs). Coordinator1 is
// made to lead again before them: the helpers ask it, and coordinator2 may take over during
// etcd3's pause.
func TestLocalRegionFaults(t *testing.T) {
	started := time.Now()
	c := newLocalCluster(t, "fo", "QUOTA_CLUSTER_LEASE_TTL="+regionFaultTTL.String(), "QUOTA_STRAND_AFTER=2s")
	c.upLeaderAndStandby(t, "ap")
	t.Run("status", func(t *testing.T) { localStatus(t, c.as(t)) })
	c.coordinator1Leads(t)
	t.Run("kill_9_at_ap", func(t *testing.T) { regionKill9(t, c.as(t), "ap") })
	t.Run("split_brain_at_us", func(t *testing.T) { regionSplitBrain(t, c.as(t), "us") })
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}

// coordinator1Leads makes sure coordinator1 leads, as the helpers that ask c.addr(0) want:
// when coordinator2 leads, stopping it (SIGTERM: it resigns) hands the lead to coordinator1,
// and it starts again as the standby.
func (c *localCluster) coordinator1Leads(t *testing.T) {
	t.Helper()
	if st := c.status(); strings.Contains(st["coordinator1"], "leader") && strings.Contains(st["coordinator2"], "standby") {
		return
	}
	c.cluster(time.Minute, "stop", "coordinator2")
	c.eventually(30*time.Second, "coordinator1 leads", func() error {
		if st := c.status(); !strings.Contains(st["coordinator1"], "leader") {
			return fmt.Errorf("coordinator1: %q", st["coordinator1"])
		}
		return nil
	})
	c.cluster(time.Minute, "start", "coordinator2")
}

// regionKill9 is region failover on real processes: kill -9 region r's leader (whichever of
// its two processes leads: regionProcs) during a 30 s load; the standby serves within the lease TTL plus 2 s; no
// acknowledged hold is lost, nothing is oversold and the audit is clean. A request in flight
// during the kill is either in the books or was answered with an error: every hold the load
// generator was told about is checked at the new leader.
func regionKill9(t *testing.T, c *localCluster, r string) {
	const (
		ttl      = regionFaultTTL
		holdTTL  = 10 * time.Minute
		total    = 40000
		loadTime = 30 * time.Second
		killAt   = 8 * time.Second
		sale     = "f"
	)
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	coord := c.addr(0)
	leaderProc, standbyProc, primary, standby := c.regionProcs(t, r)
	if out, err := c.quotactl(coord, "sale", "create", "--sale", sale, "--sku", "phone=40000", "--per-user-limit", "2",
		"--hold-ttl", holdTTL.String(), "--allocate", r+"=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	rs := c.regionClient(t, standby)
	// The standby refuses and names the leader, which is what clients follow.
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := rs.Reserve(cctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "probe-standby", Quantity: 1, RequestKey: "k"})
	ccancel()
	if apierr.Reason(err) != "NOT_LEADER" || apierr.LeaderHint(err) != primary {
		t.Fatalf("standby's answer before the failover: %v; want NOT_LEADER naming %s", err, primary)
	}

	// 30 s of buyers at the primary's address; loadgen follows NOT_LEADER answers that name
	// the leader, and asks the coordinator where the region answers when its leader is gone.
	load := c.startLoad(ctx, loadgen.Config{Sale: sale, SKU: "phone", Regions: []loadgen.Region{{Name: r, Addr: primary, Weight: 1}},
		Buyers: 1_000_000, Concurrency: 64, ConfirmRatio: 0.5, UserPrefix: "fo-", MaxDuration: loadTime, Seed: 4, ProgressEvery: 2 * time.Second})
	load.running(t, killAt)

	// kill -9 the region leader; the standby leads once the leader's lease has expired.
	tookOver := c.takeovers(t, standbyProc)
	killed := time.Now()
	c.cluster(30*time.Second, "kill", leaderProc)
	dead := time.Now() // the script returns once the process is gone
	t.Logf("cluster kill %s: %s", leaderProc, dead.Sub(killed).Round(time.Millisecond))
	probe, failover := probeFailover(ctx, t, rs, killed, ttl+15*time.Second, sale)
	t.Logf("FAILOVER: the standby %s served a reserve %s after kill -9 of the leader (lease TTL %s)", standby, failover.Round(time.Millisecond), ttl)
	if failover > ttl+2*time.Second {
		t.Errorf("failover took %s, want at most the lease TTL + 2s = %s", failover.Round(time.Millisecond), ttl+2*time.Second)
	}
	c.wantWarmTakeover(t, standbyProc, tookOver)
	viaCoordinator := c.reserveThroughCoordinator(t, r, sale, standby)

	ls := load.wait(t, loadTime+30*time.Second)
	holds := maps.Clone(ls.Holds)
	for _, id := range []string{probe, viaCoordinator} {
		if id != "" {
			holds[id] = r
		}
	}
	checkStart := time.Now()
	tally := c.lookupHolds(holds)
	tally.check(t, ls.Confirmed)
	// expires_at = creation + hold TTL, both by this machine's clock
	after, inFlight := 0, 0
	for id, exp := range tally.expires {
		if id == probe || id == viaCoordinator {
			continue
		}
		if exp.After(dead.Add(holdTTL)) {
			after++
		} else if exp.After(killed.Add(holdTTL - 2*time.Second)) {
			inFlight++
		}
	}
	t.Logf("%d holds checked at the new leader in %s; of the load's, %d created in the 2 s before the leader died, %d after",
		len(holds), time.Since(checkStart).Round(time.Millisecond), inFlight, after)
	// Buyers whose leader died ask the coordinator where region r answers now and carry on
	// there: the load must have been served by the new leader.
	if after == 0 {
		t.Errorf("the buyers were never served by the new leader")
	}

	// The audit: I1 (total units conserved) and every region's books, exit 0.
	s := c.auditSale(t, sale)
	if s.Total != total {
		t.Errorf("audit total %d, want %d", s.Total, total)
	}
	if s.Held+s.Sold < int64(len(holds)) || s.Sold < ls.Confirmed {
		t.Errorf("audit held %d + sold %d against %d acknowledged holds (with the probes), sold %d against %d confirmed",
			s.Held, s.Sold, len(holds), s.Sold, ls.Confirmed)
	}
	// No separate oversell check: with every acknowledged hold found above, held + sold ≤
	// total is what the audit's conservation (I1, checked above) and the pools' CHECKs say.
	st := c.status()
	if !strings.Contains(st[standbyProc], "leader") || !strings.HasPrefix(st[leaderProc], "stopped") {
		t.Errorf("after the failover: %s %q, %s %q; want stopped and leader", leaderProc, st[leaderProc], standbyProc, st[standbyProc])
	}
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}

// upLeaderAndStandby starts the cluster and wants every process running, with region-R
// leading and region-R-2 standing by.
func (c *localCluster) upLeaderAndStandby(t *testing.T, region string) {
	t.Helper()
	up := time.Now()
	out := c.cluster(5*time.Minute, "up")
	t.Logf("cluster up: %s\n%s", time.Since(up).Round(time.Millisecond), out)
	st := c.status()
	c.wantState(st, "running", processes...)
	leader, standby := "region-"+region, "region-"+region+"-2"
	if !strings.Contains(st[leader], "leader") || !strings.Contains(st[standby], "standby") {
		t.Fatalf("want %s leading and %s standing by:\n%s %s\n%s %s", leader, standby, leader, st[leader], standby, st[standby])
	}
}

// regionClient is a storefront's gRPC client of the region process at addr, closed with the
// test.
func (c *localCluster) regionClient(t *testing.T, addr string) quotav1.RegionServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds(trust.Storefront)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := conn.Close(); err != nil {
			t.Logf("closing the client of %s: %v", addr, err)
		}
	})
	return quotav1.NewRegionServiceClient(conn)
}

// probeFailover asks rs for a hold every 50 ms from killed on, until it answers with anything
// but NOT_LEADER or unavailable (or within fails the test); it returns the hold it got and how
// long after killed the answer came. Any answer but a hold fails the test.
func probeFailover(ctx context.Context, t *testing.T, rs quotav1.RegionServiceClient, killed time.Time, within time.Duration, sale string) (string, time.Duration) {
	t.Helper()
	var last error
	for attempts := 1; ; attempts++ {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		res, err := rs.Reserve(cctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "probe-failover", Quantity: 1, RequestKey: "probe-1"})
		ccancel()
		code := status.Code(err)
		if err == nil || (apierr.Reason(err) != "NOT_LEADER" && code != codes.Unavailable && code != codes.DeadlineExceeded) {
			took := time.Since(killed)
			if err != nil {
				t.Errorf("the standby's first answer after the failover: %v, want a hold", err)
			}
			t.Logf("the standby answered after %d probes", attempts)
			return res.GetReservation().GetHoldId(), took
		}
		last = err
		if time.Since(killed) > within {
			t.Fatalf("the standby does not serve %s after the kill (%d probes); its last answer: %v", time.Since(killed).Round(time.Millisecond), attempts, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// takeovers is the lines of process's log that say it took the lead ("region leading"), so far.
func (c *localCluster) takeovers(t *testing.T, process string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, process+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return linesWith(string(b), "region leading")
}

// wantWarmTakeover wants the process's log to say, once since the takeovers before (what
// takeovers returned before the kill), that it took over from the warm copy it kept (quotad
// --standby-refresh, on by default), not by loading every hold.
func (c *localCluster) wantWarmTakeover(t *testing.T, process string, before []string) {
	t.Helper()
	lines := c.takeovers(t, process)
	if len(lines) >= len(before) {
		lines = lines[len(before):]
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "load=warm") {
		t.Errorf("%s's log, lines with \"region leading\" since the kill: %q; want one, with load=warm", process, lines)
	} else {
		t.Logf("%s's takeover: %s", process, lines[0])
	}
}

// reserveThroughCoordinator waits until the coordinator lists region r at its new leader,
// then reserves with `quotactl reserve --region r` (which finds the region through the
// coordinator) and returns the hold.
func (c *localCluster) reserveThroughCoordinator(t *testing.T, r, sale, leader string) string {
	t.Helper()
	coord := c.addr(0)
	c.eventually(5*time.Second, "the coordinator lists "+r+" at "+leader, func() error {
		out, err := c.quotactl(coord, "regions")
		if err != nil || !strings.Contains(out, leader) {
			return fmt.Errorf("regions: %v\n%s", err, out)
		}
		return nil
	})
	var res struct {
		HoldID string `json:"hold_id"`
		State  string `json:"state"`
	}
	out, err := c.quotactl(coord, "reserve", "--region", r, "--sale", sale, "--sku", "phone", "--user", "probe-quotactl",
		"--request-key", "k", "-o", "json")
	if err != nil {
		t.Errorf("quotactl reserve --region %s after the failover: %v\n%s", r, err, out)
	} else if err := json.Unmarshal([]byte(out), &res); err != nil || res.State != "held" {
		t.Errorf("quotactl reserve --region %s after the failover: %s (%v)", r, out, err)
	}
	return res.HoldID
}

// currentRegionAddr asks the coordinator where region answers now ("" when it cannot say).
func currentRegionAddr(ctx context.Context, creds credentials.TransportCredentials, coord, region string) string {
	conn, err := grpc.NewClient(coord, grpc.WithTransportCredentials(creds))
	if err != nil {
		return ""
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := quotav1.NewCoordinatorServiceClient(conn).ListRegions(ctx, &quotav1.ListRegionsRequest{})
	if err != nil {
		return ""
	}
	for _, r := range resp.GetRegions() {
		if r.GetName() == region {
			return r.GetAddress()
		}
	}
	return ""
}

// linesWith returns the lines of text that contain sub.
func linesWith(text, sub string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return out
}
