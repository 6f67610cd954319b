package local_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
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

// auditOut is what the test reads of `quotactl audit -o json`.
type auditOut struct {
	OK   bool `json:"ok"`
	SKUs []struct {
		Sale        string `json:"sale"`
		SKU         string `json:"sku"`
		OK          bool   `json:"ok"`
		Total       int64  `json:"total"`
		Unallocated int64  `json:"unallocated"`
		Available   int64  `json:"available"`
		Held        int64  `json:"held"`
		Sold        int64  `json:"sold"`
		InFlight    int64  `json:"in_flight"`
	} `json:"skus"`
	Violations []json.RawMessage `json:"violations"`
}

// TestLocalRegionFailover is region failover on real processes: kill -9 the region leader
// during a 30 s load; the standby serves within the lease TTL plus 2 s; no acknowledged hold is
// lost, nothing is oversold and the audit is clean. A request in flight during the kill is
// either in the books or was answered with an error: every hold the load generator was told
// about is checked at the new leader.
func TestLocalRegionFailover(t *testing.T) {
	const (
		ttl      = 2 * time.Second
		holdTTL  = 10 * time.Minute
		total    = 40000
		loadTime = 30 * time.Second
		killAt   = 8 * time.Second
		sale     = "f"
	)
	started := time.Now()
	c := newLocalCluster(t, "fo", "QUOTA_CLUSTER_LEASE_TTL="+ttl.String())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	up := time.Now()
	out := c.cluster(5*time.Minute, "up")
	opCreds := c.creds(trust.Operator)
	t.Logf("cluster up: %s\n%s", time.Since(up).Round(time.Millisecond), out)
	st := c.status()
	c.wantState(st, "running", processes...)
	if !strings.Contains(st["region-us"], "leader") || !strings.Contains(st["region-us-2"], "standby") {
		t.Fatalf("want region-us leading and region-us-2 standing by:\nregion-us %s\nregion-us-2 %s", st["region-us"], st["region-us-2"])
	}

	coord, primary, standby := c.addr(0), c.addr(1), c.addr(11)
	if out, err := c.quotactl(coord, "sale", "create", "--sale", sale, "--sku", "phone=40000", "--per-user-limit", "2",
		"--hold-ttl", holdTTL.String(), "--allocate", "us=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	conn, err := grpc.NewClient(standby, grpc.WithTransportCredentials(c.creds(trust.Storefront)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rs := quotav1.NewRegionServiceClient(conn)
	// The standby refuses and names the leader, which is what clients follow.
	{
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := rs.Reserve(cctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "probe-standby", Quantity: 1, RequestKey: "k"})
		ccancel()
		if apierr.Reason(err) != "NOT_LEADER" || apierr.LeaderHint(err) != primary {
			t.Fatalf("standby's answer before the failover: %v; want NOT_LEADER naming %s", err, primary)
		}
	}

	// 30 s of buyers at the primary's address; loadgen follows NOT_LEADER answers that name
	// the leader.
	type result struct {
		st  loadgen.Stats
		err error
	}
	done := make(chan result, 1)
	var loadWG sync.WaitGroup
	loadWG.Add(1)
	// On every way out (t.Fatal included) the load stops before the test ends: it logs.
	defer func() { cancel(); loadWG.Wait() }()
	go func() {
		defer loadWG.Done()
		st, err := loadgen.Run(ctx, loadgen.Config{Sale: sale, SKU: "phone", Creds: c.creds(trust.Storefront), Regions: []loadgen.Region{{Name: "us", Addr: primary, Weight: 1}},
			Buyers: 1_000_000, Concurrency: 64, ConfirmRatio: 0.5, UserPrefix: "fo-", MaxDuration: loadTime, Seed: 4,
			Resolve:       func(ctx context.Context, region string) string { return currentRegionAddr(ctx, opCreds, coord, region) },
			ProgressEvery: 2 * time.Second, Progress: func(s loadgen.Stats) {
				t.Logf("load %4.1fs: %d buyers, %d holds, %d confirmed, %d failed, %d retries",
					s.Elapsed.Seconds(), s.Buyers, s.Granted, s.Confirmed, s.Failed, s.Retries)
			}})
		done <- result{st, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the load ended before the kill: %+v %v", r.st, r.err)
	case <-time.After(killAt):
	}

	// kill -9 the region leader; the standby leads once the leader's lease has expired.
	killed := time.Now()
	c.cluster(30*time.Second, "kill", "region-us")
	dead := time.Now() // the script returns once the process is gone
	t.Logf("cluster kill region-us: %s", dead.Sub(killed).Round(time.Millisecond))
	var (
		probe     *quotav1.Reservation
		probeErr  error
		failover  time.Duration
		attempts  int
		lastRetry error
	)
	for {
		attempts++
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		res, err := rs.Reserve(cctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: "probe-failover", Quantity: 1, RequestKey: "probe-1"})
		ccancel()
		code := status.Code(err)
		if err == nil || (apierr.Reason(err) != "NOT_LEADER" && code != codes.Unavailable && code != codes.DeadlineExceeded) {
			failover = time.Since(killed)
			probe, probeErr = res.GetReservation(), err
			break
		}
		lastRetry = err
		if time.Since(killed) > ttl+15*time.Second {
			t.Fatalf("the standby does not serve %s after the kill (%d probes); its last answer: %v", time.Since(killed).Round(time.Millisecond), attempts, lastRetry)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("FAILOVER: the standby %s served a reserve %s after kill -9 of the leader (lease TTL %s, %d probes)",
		standby, failover.Round(time.Millisecond), ttl, attempts)
	if failover > ttl+2*time.Second {
		t.Errorf("failover took %s, want at most the lease TTL + 2s = %s", failover.Round(time.Millisecond), ttl+2*time.Second)
	}
	if probeErr != nil {
		t.Errorf("the standby's first answer after the failover: %v, want a hold", probeErr)
	}
	// It took over from the warm copy it kept (quotad --standby-refresh, on by default), not by
	// loading every hold: its log says so.
	if b, err := os.ReadFile(filepath.Join(c.dir, "region-us-2.log")); err != nil {
		t.Error(err)
	} else if lines := linesWith(string(b), "region leading"); len(lines) != 1 || !strings.Contains(lines[0], "load=warm") {
		t.Errorf("the standby's log, lines with \"region leading\": %q; want one, with load=warm", lines)
	} else {
		t.Logf("the standby's takeover: %s", lines[0])
	}
	// Clients that find regions through the coordinator's list reach the new leader too.
	c.eventually(5*time.Second, "the coordinator lists us at the standby", func() error {
		out, err := c.quotactl(coord, "regions")
		if err != nil || !strings.Contains(out, standby) {
			return fmt.Errorf("regions: %v\n%s", err, out)
		}
		return nil
	})
	var viaCoordinator struct {
		HoldID string `json:"hold_id"`
		State  string `json:"state"`
	}
	if out, err := c.quotactl(coord, "reserve", "--region", "us", "--sale", sale, "--sku", "phone", "--user", "probe-quotactl",
		"--request-key", "k", "-o", "json"); err != nil {
		t.Errorf("quotactl reserve --region us after the failover: %v\n%s", err, out)
	} else if err := json.Unmarshal([]byte(out), &viaCoordinator); err != nil || viaCoordinator.State != "held" {
		t.Errorf("quotactl reserve --region us after the failover: %s (%v)", out, err)
	}

	var r result
	select {
	case r = <-done:
	case <-time.After(loadTime + 30*time.Second):
		t.Fatal("the load did not end")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	ls := r.st
	t.Logf("load: %d buyers, %d holds acknowledged, %d confirmed, %d refunded, %d failed, %d exhausted, %d retries in %s",
		ls.Buyers, len(ls.Holds), ls.Confirmed, ls.Refunded, ls.Failed, ls.Exhausted, ls.Retries, ls.Elapsed.Round(time.Millisecond))
	if len(ls.Holds) == 0 {
		t.Fatal("the load acknowledged no hold")
	}

	// Every acknowledged hold is at the new leader, held or sold.
	holds := make([]string, 0, len(ls.Holds)+2)
	for id := range ls.Holds {
		holds = append(holds, id)
	}
	if probe != nil {
		holds = append(holds, probe.GetHoldId())
	}
	if viaCoordinator.HoldID != "" {
		holds = append(holds, viaCoordinator.HoldID)
	}
	sort.Strings(holds)
	var (
		mu                          sync.Mutex
		tally                       holdTally
		after, inFlight             int
		ids                         = make(chan string)
		wg                          sync.WaitGroup
		createdAfter, createdAround = dead.Add(holdTTL), killed.Add(holdTTL - 2*time.Second)
		checkStart                  = time.Now()
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := rs.GetReservation(cctx, &quotav1.GetReservationRequest{HoldId: id})
				ccancel()
				mu.Lock()
				tally.add(id, res, err)
				// expires_at = creation + hold TTL, both by this machine's clock
				if exp := res.GetReservation().GetExpiresAt().AsTime(); err == nil && exp.After(createdAfter) {
					after++
				} else if err == nil && exp.After(createdAround) {
					inFlight++
				}
				mu.Unlock()
			}
		}()
	}
	for _, id := range holds {
		ids <- id
	}
	close(ids)
	wg.Wait()
	t.Logf("%d holds checked at the new leader in %s: %d held, %d sold, %d lost; %d created in the 2 s before the leader died, %d after",
		len(holds), time.Since(checkStart).Round(time.Millisecond), tally.held, tally.sold, len(tally.lost), inFlight, after)
	tally.check(t, ls.Confirmed)
	// Buyers whose leader died ask the coordinator where region us answers now and carry on
	// there: the load must have been served by the new leader.
	byLoad := after - countProbes(probe, viaCoordinator.HoldID)
	t.Logf("holds the load generator was granted after the kill: %d (by expiry time; the probes made %d)", byLoad, countProbes(probe, viaCoordinator.HoldID))
	if byLoad <= 0 {
		t.Errorf("the buyers were never served by the new leader")
	}

	// The audit: I1 (total units conserved) and every region's books, exit 0.
	out, err = c.quotactl(coord, "audit", "--sale", sale, "-o", "json")
	if err != nil {
		t.Fatalf("quotactl audit: %v\n%s", err, out)
	}
	var a auditOut
	if err := json.Unmarshal([]byte(out), &a); err != nil || len(a.SKUs) != 1 {
		t.Fatalf("audit output: %v\n%s", err, out)
	}
	s := a.SKUs[0]
	t.Logf("audit: ok %v; total %d = unallocated %d + available %d + held %d + sold %d + in flight %d",
		a.OK, s.Total, s.Unallocated, s.Available, s.Held, s.Sold, s.InFlight)
	if !a.OK || !s.OK || len(a.Violations) != 0 {
		t.Errorf("audit not clean:\n%s", out)
	}
	if s.Total != total || s.Unallocated+s.Available+s.Held+s.Sold+s.InFlight != total {
		t.Errorf("units not conserved: %+v, want total %d", s, total)
	}
	if s.Held+s.Sold < int64(len(holds)) || s.Sold < ls.Confirmed {
		t.Errorf("audit held %d + sold %d against %d acknowledged holds (with the probes), sold %d against %d confirmed",
			s.Held, s.Sold, len(holds), s.Sold, ls.Confirmed)
	}
	// No separate oversell check: with every acknowledged hold found above, held + sold ≤
	// total is what the audit's conservation (I1, checked above) and the pools' CHECKs say.
	st = c.status()
	if !strings.Contains(st["region-us-2"], "leader") || !strings.HasPrefix(st["region-us"], "stopped") {
		t.Errorf("after the failover: region-us %q, region-us-2 %q; want stopped and leader", st["region-us"], st["region-us-2"])
	}
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}

func countProbes(probe *quotav1.Reservation, viaCoordinator string) int {
	n := 0
	if probe != nil {
		n++
	}
	if viaCoordinator != "" {
		n++
	}
	return n
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

// holdTally counts acknowledged holds as a leader reports them: held, sold, or lost (missing,
// or in another state).
type holdTally struct {
	held, sold int
	lost       []string
}

func (h *holdTally) add(id string, res *quotav1.GetReservationResponse, err error) {
	switch s := res.GetReservation().GetState(); {
	case err != nil:
		h.lost = append(h.lost, id+": "+err.Error())
	case s == quotav1.HoldState_HOLD_STATE_HELD:
		h.held++
	case s == quotav1.HoldState_HOLD_STATE_SOLD:
		h.sold++
	default:
		h.lost = append(h.lost, id+": state "+s.String())
	}
}

// check fails the test on any lost hold, or fewer sold than the confirms acknowledged.
func (h *holdTally) check(t *testing.T, confirmed int64) {
	t.Helper()
	if len(h.lost) > 0 {
		t.Errorf("acknowledged holds missing or not held/sold at the new leader, for instance:\n%s",
			strings.Join(h.lost[:min(len(h.lost), 10)], "\n"))
	}
	if int64(h.sold) < confirmed {
		t.Errorf("%d of the acknowledged holds are sold, but %d confirms were acknowledged", h.sold, confirmed)
	}
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
