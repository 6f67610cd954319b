package local_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's utime and stime (100 on
// every Linux this runs on; getconf CLK_TCK).
const clockTicks = 100

// cpuOf is process pid's CPU time so far, user and system, from /proc/PID/stat.
func cpuOf(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// the fields after the command's closing parenthesis: state is field 3, utime 14, stime 15
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(ut+st) * time.Second / clockTicks
}

// pollPhase is one phase of the measurement: where the polls went, how many were answered
// in the measured window, and the CPU the leader and the edges spent in it.
type pollPhase struct {
	name         string
	polls, fails int64
	window       time.Duration
	leader, edge time.Duration
}

// envInt is the integer in environment variable k, or def.
func envInt(t *testing.T, k string, def int) int {
	t.Helper()
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", k, v)
	}
	return n
}

// TestLocalPollCPU measures what a queued buyer's poll costs the region's leader, polled
// directly and through one and two storefront edges (only with QUOTA_POLL_CPU=1; figures in
// docs/scaling.md, "Polls through edges"). `up`; a sale whose waiting room admits one buyer a
// second, so that QUOTA_POLL_CPU_BUYERS (5,000) buyers entered at region-us stay queued; then,
// for QUOTA_POLL_CPU_SECONDS (20) each after 3 s of warm-up, every buyer polls at the pace its
// retry_after_ms asks: with no polls (the leader's idle cost), at region-us's own listener, at
// us's storefront address with edge-us-2 stopped (one edge), and with both edges. Each phase's
// CPU is /proc/PID/stat's utime + stime of the leader and of the edges, before and after.
func TestLocalPollCPU(t *testing.T) {
	if os.Getenv("QUOTA_POLL_CPU") != "1" {
		t.Skip("QUOTA_POLL_CPU=1 runs it: a measurement of about 2 minutes after up")
	}
	buyers := envInt(t, "QUOTA_POLL_CPU_BUYERS", 5000)
	window := time.Duration(envInt(t, "QUOTA_POLL_CPU_SECONDS", 20)) * time.Second
	const sale, warm = "polls", 3 * time.Second
	c := newLocalCluster(t, "pc", "QUOTA_CLUSTER_EDGES=2")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c.cluster(5*time.Minute, "up")
	if out, err := c.quotactl(c.addr(0), "sale", "create", "--sale", sale, "--sku", "phone=100", "--admit-rate", "1",
		"--ticket-ttl", "10m", "--allocate", "us=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	leaderURL := edgeOf(t, c.addr(1))
	ids := c.enterQueued(ctx, leaderURL, sale, buyers)

	leader := c.pidOf("region-us")
	var phases []pollPhase
	run := func(name, base string, edges ...string) {
		hc := c.storefrontClient(16, 10*time.Second)
		hc.Transport = &buyerAddrs{rt: hc.Transport, prefix: "10.9"}
		p := pollPhase{name: name, window: window}
		var polls, fails atomic.Int64
		pctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		if base != "" {
			for _, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pollQueued(pctx, hc, base+"/v1/sales/"+sale+"/admissions/"+id, &polls, &fails)
				}()
			}
		}
		time.Sleep(warm)
		pids := make([]int, len(edges))
		var e0 time.Duration
		for i, e := range edges {
			pids[i] = c.pidOf(e)
			e0 += cpuOf(t, pids[i])
		}
		l0, n0, f0 := cpuOf(t, leader), polls.Load(), fails.Load()
		time.Sleep(window)
		p.leader, p.polls, p.fails = cpuOf(t, leader)-l0, polls.Load()-n0, fails.Load()-f0
		for _, pid := range pids {
			p.edge += cpuOf(t, pid)
		}
		p.edge -= e0
		stop()
		wg.Wait()
		phases = append(phases, p)
	}
	run("idle (no polls)", "")
	run("direct to the leader", leaderURL)
	c.cluster(time.Minute, "stop", "edge-us-2")
	run("through one edge", c.storefrontOf("us"), "edge-us")
	c.cluster(time.Minute, "start", "edge-us-2")
	run("through two edges", c.storefrontOf("us"), "edge-us", "edge-us-2")
	reportPollCPU(t, buyers, phases)
}

// enterQueued enters n buyers into sale's waiting room at base, 32 at a time, and returns
// their admission ids; every one must be queued (202; or admitted, one a second).
func (c *localCluster) enterQueued(ctx context.Context, base, sale string, n int) []string {
	c.t.Helper()
	hc := c.edgeClient("10.8", 10*time.Second)
	ids := make([]string, n)
	var (
		next atomic.Int64
		bad  atomic.Value
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n && bad.Load() == nil; i = int(next.Add(1)) - 1 {
				a, err := edgeDo(ctx, hc, "POST", base+"/v1/sales/"+sale+"/admissions", map[string]string{"user_id": "q-" + strconv.Itoa(i)})
				if err == nil && (a.code != http.StatusAccepted && a.code != http.StatusCreated || a.str("admission_id") == "") {
					err = fmt.Errorf("buyer %d entering: %d %v, want 202 queued (or 201, one a second)", i, a.code, a.body)
				}
				if err != nil {
					bad.Store(err)
					return
				}
				ids[i] = a.str("admission_id")
			}
		}()
	}
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("%d buyers entered and queued at %s in %s", n, base, time.Since(start).Round(time.Millisecond))
	return ids
}

// pollQueued polls one queued admission at u at the pace its answers ask (retry_after_ms,
// with a tenth of jitter; the first poll at a random point of the first 5 s, so the buyers'
// polls spread) until ctx ends or the buyer is admitted, counting the answered polls and the
// others (no answer, or not 200/202: tried again a second later).
func pollQueued(ctx context.Context, hc *http.Client, u string, polls, fails *atomic.Int64) {
	wait := time.Duration(rand.N(5000)) * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		a, err := edgeDo(ctx, hc, "GET", u, nil)
		if err != nil || (a.code != http.StatusAccepted && a.code != http.StatusOK) {
			if ctx.Err() == nil {
				fails.Add(1)
			}
			wait = time.Second
			continue
		}
		polls.Add(1)
		ms, _ := a.body["retry_after_ms"].(float64)
		if a.str("state") != "queued" || ms <= 0 {
			return // admitted (one a second) or gone: this buyer stops polling
		}
		wait = time.Duration(ms)*time.Millisecond + time.Duration(rand.N(int64(ms)/10+1))*time.Millisecond
	}
}

// reportPollCPU logs the phases side by side: polls a second, the leader's CPU per poll (and
// net of its idle cost), its share of one core, the edges' CPU per poll, and the ratio of the
// leader's net CPU per poll through edges to directly. The leader's net CPU per poll through
// an edge must be under half of its direct cost (the edges answer polls from their copy).
func reportPollCPU(t *testing.T, buyers int, phases []pollPhase) {
	t.Helper()
	idle := phases[0].leader.Seconds() / phases[0].window.Seconds() // leader cores when nobody polls
	var b strings.Builder
	fmt.Fprintf(&b, "POLL CPU: %d queued buyers polling at their retry_after_ms, %s a phase, leader region-us\n", buyers, phases[0].window)
	fmt.Fprintf(&b, "%-22s %8s %6s %9s %12s %14s %13s %12s %13s\n", "phase", "polls", "failed", "polls/s", "leader cores", "leader µs/poll",
		"net µs/poll", "edges cores", "edge µs/poll")
	net := make([]float64, len(phases))
	for i, p := range phases {
		secs := p.window.Seconds()
		perPoll, netS, edgePer := "-", "-", "-"
		if p.polls > 0 {
			perPoll = fmt.Sprintf("%.1f", float64(p.leader.Microseconds())/float64(p.polls))
			net[i] = (p.leader.Seconds() - idle*secs) * 1e6 / float64(p.polls)
			netS = fmt.Sprintf("%.1f", net[i])
			edgePer = fmt.Sprintf("%.1f", float64(p.edge.Microseconds())/float64(p.polls))
		}
		fmt.Fprintf(&b, "%-22s %8d %6d %9.0f %12.3f %14s %13s %12.3f %13s\n", p.name, p.polls, p.fails, float64(p.polls)/secs,
			p.leader.Seconds()/secs, perPoll, netS, p.edge.Seconds()/secs, edgePer)
	}
	direct := net[1]
	for _, i := range []int{2, 3} {
		fmt.Fprintf(&b, "ratio %s / direct (net µs/poll): %.3f\n", phases[i].name, net[i]/direct)
	}
	t.Log(b.String())
	fmt.Print(b.String())
	for _, p := range phases[1:] {
		if p.polls < int64(buyers)/10 {
			t.Errorf("%s: %d polls in %s, want at least one for every tenth buyer (%d)", p.name, p.polls, p.window, buyers/10)
		}
	}
	for _, i := range []int{2, 3} {
		if net[i] >= direct/2 {
			t.Errorf("%s: the leader spent %.1f µs a poll net of idle, direct %.1f; want under half", phases[i].name, net[i], direct)
		}
	}
}
