package local_test

import (
	"context"
	"fmt"
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
// acknowledged hold is at the new leader, and the audit is clean.
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
	// The TTL + 2 s is for a killed leader; a paused one may also hold the epoch row
	// for epochWait, and a loaded machine adds its own delays.
	if took > ttl+2*time.Second+epochWait+5*time.Second {
		t.Errorf("the standby served after %s; want within the lease TTL + 2 s + %s (+ 5 s of slack)", took.Round(time.Millisecond), epochWait)
	}
	time.Sleep(time.Until(paused.Add(pausedFor)))
	c.cluster(30*time.Second, "resume", leader)
	// The resumed old leader, asked directly, does not grant: it answers NOT_LEADER and names
	// the new leader (it may first answer with the outcome of what it had queued).
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

	ls := load.wait(t, loadTime+30*time.Second)
	c.lookupHolds(ls.Holds).check(t, ls.Confirmed)
	c.auditSale(t, sale)
	// What the old leader did once resumed, from its log: it stepped down; any batch it still
	// tried met the epoch fence.
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
