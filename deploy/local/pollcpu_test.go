package local_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's utime and stime (100 on
// every Linux this runs on; getconf CLK_TCK).
const clockTicks = 100

// cpuOf is process pid's CPU time so far, user and system, from /proc/PID/stat.
func cpuOf(t *testing.T, pid int) time.Duration {
	t.Helper()
	d, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// procCPU is process pid's CPU time so far, user and system, from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// the fields after the command's closing parenthesis: state is field 3, utime 14, stime 15
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// pollPhase is one phase of the measurement: where the polls went, how many were answered
// in the measured window against how many the buyers asked for, and the CPU the leader, each
// edge and the load generator (this test process) spent in it.
type pollPhase struct {
	name         string
	polling      bool // the buyers polled in it
	polls, fails int64
	byLeader     int64   // polls the leader answered itself (quota_line_polls_total): forwarded by edges
	asked        float64 // polls a second the queued buyers asked for, at the window's end
	window       time.Duration
	leader, gen  time.Duration
	edges        []time.Duration
}

// edge is the edges' CPU in all.
func (p pollPhase) edge() time.Duration {
	var d time.Duration
	for _, e := range p.edges {
		d += e
	}
	return d
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

// pollCPU is the measurement's setting: the cluster, the sale, the leader's pid, the
// buyers' poll generator and each phase's warm-up and window.
type pollCPU struct {
	c            *localCluster
	sale         string
	leader       int
	leaderURL    string
	metrics      *http.Client // an operator's, for the leader's /metrics
	gen          *pollGen
	warm, window time.Duration
}

// TestLocalPollCPU measures what a queued buyer's poll costs the region's leader, polled
// directly and through one, two and four storefront edges (only with QUOTA_POLL_CPU=1;
// figures in docs/scaling.md, "Polls through edges"). `up` with four edges a region; a sale
// whose waiting room admits one buyer a second, so that QUOTA_POLL_CPU_BUYERS (5,000; at most
// 200,000, a room's bound) buyers entered at region-us stay queued; then, for
// QUOTA_POLL_CPU_SECONDS (20) each after 5 s of warm-up, the buyers poll at the pace their
// retry_after_ms asks, capped at QUOTA_POLL_CPU_RATE (2,000) polls a second in all (pollGen):
// with no polls (the leader's idle cost), at region-us's own listener, at us's storefront
// address with edge-us-2..4 stopped (one edge), with edge-us-2 started again (two), and with
// all four; then with the four edges still watching the line and nobody polling (what the
// edges' fetches cost the leader whatever the polls). Each phase's CPU is /proc/PID/stat's
// utime + stime of the leader, of each edge and of this process, before and after; with
// QUOTA_POLL_CPU_PERF=DIR each phase also records a perf profile of the leader (profile).
func TestLocalPollCPU(t *testing.T) {
	if os.Getenv("QUOTA_POLL_CPU") != "1" {
		t.Skip("QUOTA_POLL_CPU=1 runs it: a measurement of about 3 minutes after up (5,000 buyers)")
	}
	buyers := envInt(t, "QUOTA_POLL_CPU_BUYERS", 5000)
	if buyers > 200_000 {
		t.Fatalf("QUOTA_POLL_CPU_BUYERS=%d: at most 200000, the entries a room keeps", buyers)
	}
	rate := envInt(t, "QUOTA_POLL_CPU_RATE", 2000)
	const sale = "polls"
	c := newLocalCluster(t, "pc", "QUOTA_CLUSTER_EDGES=4")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute+time.Duration(buyers)*3*time.Millisecond)
	defer cancel()
	c.cluster(5*time.Minute, "up")
	if out, err := c.quotactl(c.addr(0), "sale", "create", "--sale", sale, "--sku", "phone=100", "--admit-rate", "1",
		"--ticket-ttl", "10m", "--allocate", "us=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	leaderURL, front := edgeOf(t, c.addr(1)), c.storefrontOf("us")
	ids, every := c.enterQueued(ctx, leaderURL, sale, buyers)
	p := &pollCPU{c: c, sale: sale, leader: c.pidOf("region-us"), leaderURL: leaderURL, metrics: c.operatorClient(),
		gen:  newPollGen(sale, ids, every, float64(rate)),
		warm: 5 * time.Second, window: time.Duration(envInt(t, "QUOTA_POLL_CPU_SECONDS", 20)) * time.Second}
	phases := []pollPhase{p.run(ctx, "idle (no polls)", ""), p.run(ctx, "direct to the leader", leaderURL)}
	for _, e := range []string{"edge-us-2", "edge-us-3", "edge-us-4"} {
		c.cluster(time.Minute, "stop", e)
	}
	phases = append(phases, p.run(ctx, "through one edge", front, "edge-us"))
	c.cluster(time.Minute, "start", "edge-us-2")
	phases = append(phases, p.run(ctx, "through two edges", front, "edge-us", "edge-us-2"))
	c.cluster(time.Minute, "start", "edge-us-3")
	c.cluster(time.Minute, "start", "edge-us-4")
	four := []string{"edge-us", "edge-us-2", "edge-us-3", "edge-us-4"}
	phases = append(phases, p.run(ctx, "through four edges", front, four...))
	// the edges keep fetching the line (for two minutes after the last poll): what that costs
	phases = append(phases, p.run(ctx, "four edges watching, no polls", "", four...))
	reportPollCPU(t, buyers, rate, phases)
}

// run is one phase: the buyers poll at base (none when base is ""), over 32 connections of
// their own (which the kernel spreads over the edges sharing the address), and after the
// warm-up the CPU of the leader, of edges and of this process is read over the window.
func (p *pollCPU) run(ctx context.Context, name, base string, edges ...string) pollPhase {
	t := p.c.t
	t.Helper()
	ph := pollPhase{name: name, polling: base != "", window: p.window, edges: make([]time.Duration, len(edges))}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	if base != "" {
		hc := p.c.storefrontClient(32, 10*time.Second)
		hc.Transport = &buyerAddrs{rt: hc.Transport, prefix: "10.9"}
		go func() {
			defer close(done)
			p.gen.run(pctx, hc, base)
		}()
	} else {
		close(done)
	}
	time.Sleep(p.warm)
	if base != "" && len(edges) > 0 {
		p.settle(name)
	}
	pids := make([]int, len(edges))
	for i, e := range edges {
		pids[i] = p.c.pidOf(e)
		ph.edges[i] = -cpuOf(t, pids[i])
	}
	self := os.Getpid()
	lp0 := p.leaderPolls()
	l0, g0, n0, f0 := cpuOf(t, p.leader), cpuOf(t, self), p.gen.polls.Load(), p.gen.fails.Load()
	profiled := p.profile(name)
	time.Sleep(p.window)
	ph.leader, ph.gen = cpuOf(t, p.leader)-l0, cpuOf(t, self)-g0
	ph.byLeader = p.leaderPolls() - lp0
	ph.polls, ph.fails = p.gen.polls.Load()-n0, p.gen.fails.Load()-f0
	for i, pid := range pids {
		ph.edges[i] += cpuOf(t, pid)
	}
	ph.asked = p.gen.askedRate()
	stop()
	<-done
	<-profiled
	if ph.polling {
		t.Logf("%s: %d polls in %s (buyers asked %.0f/s), %d failed", name, ph.polls, p.window, ph.asked, ph.fails)
	}
	return ph
}

// profile records, with QUOTA_POLL_CPU_PERF=DIR, a CPU profile of the leader over the
// phase's window with Linux perf (perf record -g, 997 samples a second, in DIR/<phase>.data;
// read it with perf report -i): where the leader's CPU goes. The channel is closed once it is
// written (at once without QUOTA_POLL_CPU_PERF).
func (p *pollCPU) profile(name string) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("QUOTA_POLL_CPU_PERF")
	if dir == "" {
		close(done)
		return done
	}
	out := filepath.Join(dir, strings.NewReplacer(" ", "_", "(", "", ")", "", ",", "").Replace(name)+".data")
	cmd := exec.Command("perf", "record", "-F", "997", "-g", "-o", out, "-p", strconv.Itoa(p.leader), "--",
		"sleep", strconv.Itoa(int(p.window.Seconds())))
	go func() {
		defer close(done)
		if b, err := cmd.CombinedOutput(); err != nil {
			p.c.t.Errorf("perf record of the leader (QUOTA_POLL_CPU_PERF): %v\n%s", err, b)
		}
	}()
	return done
}

// settle waits (up to a minute) until the edges answer the polls from their copies of the
// line: until the leader answers under 1 % of the polls in a second. An edge forwards every
// poll until its first copy of the line is in, a copy of every entry, which takes seconds at
// 200,000 buyers on a loaded machine.
func (p *pollCPU) settle(name string) {
	start := time.Now()
	for time.Since(start) < time.Minute {
		l0, n0 := p.leaderPolls(), p.gen.polls.Load()
		time.Sleep(time.Second)
		if l, n := p.leaderPolls()-l0, p.gen.polls.Load()-n0; l*100 <= n {
			p.c.t.Logf("%s: the edges answer from their copies (%d of %d polls forwarded in a second) %s after the warm-up",
				name, l, n, time.Since(start).Round(time.Second))
			return
		}
	}
	p.c.t.Logf("%s: the edges still forward over 1 %% of the polls a minute after the warm-up", name)
}

// leaderPolls is the leader's quota_line_polls_total: the polls it answered itself (-1 when
// its /metrics does not answer).
func (p *pollCPU) leaderPolls() int64 {
	for _, l := range metricLines(p.metrics, p.leaderURL) {
		if f := strings.Fields(l); len(f) == 2 && strings.HasPrefix(f[0], "quota_line_polls_total") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				return int64(v)
			}
		}
	}
	return -1
}

// operatorClient is an HTTP client with the cluster's operator certificate (for /metrics).
func (c *localCluster) operatorClient() *http.Client {
	c.t.Helper()
	m, err := trust.Load(c.certsDir())
	if err != nil {
		c.t.Fatal(err)
	}
	cfg, err := m.ClientConfig(trust.Operator)
	if err != nil {
		c.t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	c.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// enterQueued enters n buyers into sale's waiting room at base, 64 at a time, and returns
// their admission ids and the poll interval each was asked for (retry_after_ms); every one
// must be queued (202; or admitted, one a second). A buyer told to come back (429, 503, or
// ABORTED while their binding is written) enters again, up to 5 times: entering again answers
// the same place.
func (c *localCluster) enterQueued(ctx context.Context, base, sale string, n int) ([]string, []time.Duration) {
	c.t.Helper()
	hc := c.edgeClient("10.8", 10*time.Second)
	ids, every := make([]string, n), make([]time.Duration, n)
	var (
		next atomic.Int64
		bad  atomic.Value
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n && bad.Load() == nil; i = int(next.Add(1)) - 1 {
				a, err := enterOnce(ctx, hc, base+"/v1/sales/"+sale+"/admissions", "q-"+strconv.Itoa(i))
				if err != nil {
					bad.Store(fmt.Errorf("buyer %d: %w", i, err))
					return
				}
				ids[i] = a.str("admission_id")
				if ms, _ := a.body["retry_after_ms"].(float64); ms > 0 && a.str("state") == "queued" {
					every[i] = time.Duration(ms) * time.Millisecond
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		c.t.Fatal(err)
	}
	took := time.Since(start)
	c.t.Logf("%d buyers entered and queued at %s in %s (%.0f a second)", n, base, took.Round(time.Millisecond),
		float64(n)/took.Seconds())
	return ids, every
}

// enterOnce enters user at u (the room's admissions), entering again when told to come back.
func enterOnce(ctx context.Context, hc *http.Client, u, user string) (edgeAnswer, error) {
	var (
		a   edgeAnswer
		err error
	)
	for try := range 5 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return a, ctx.Err()
			case <-time.After(time.Duration(try) * 200 * time.Millisecond):
			}
		}
		a, err = edgeDo(ctx, hc, "POST", u, map[string]string{"user_id": user})
		switch {
		case err != nil && ctx.Err() != nil:
			return a, err
		case err != nil, a.code == http.StatusTooManyRequests, a.code == http.StatusServiceUnavailable,
			a.code == http.StatusConflict && a.errCode() == "ABORTED":
			continue
		case a.code != http.StatusAccepted && a.code != http.StatusCreated || a.str("admission_id") == "":
			return a, fmt.Errorf("entering: %d %v, want 202 queued (or 201, one a second)", a.code, a.body)
		}
		return a, nil
	}
	return a, fmt.Errorf("entering, 5 times: %d %v %v", a.code, a.body, err)
}

// reportPollCPU logs the phases side by side (pollTable) and the ratios of the leader's CPU
// per poll through edges to directly, and checks them. Every polling phase must answer at
// least a quarter of what it aimed at (the asked pace or the cap, the lower). The leader's
// net CPU per poll through edges (net of its idle cost) must be under half its direct cost;
// and its marginal CPU per poll through edges, net also of what the edges' watching of the
// line costs it with nobody polling (the last phase: per edge, whatever the polls), under
// 5 %: the edges answer polls from their copy.
func reportPollCPU(t *testing.T, buyers, rate int, phases []pollPhase) {
	t.Helper()
	idle := phases[0].leader.Seconds() / phases[0].window.Seconds() // leader cores when nobody polls
	w := phases[len(phases)-1]
	watch := (w.leader.Seconds()/w.window.Seconds() - idle) / float64(len(w.edges)) // leader cores per watching edge
	var b strings.Builder
	net := pollTable(&b, buyers, rate, phases, idle)
	direct := net[1]
	fmt.Fprintf(&b, "the leader's cost of one edge watching the line, nobody polling: %.4f cores\n", watch)
	marginal := make([]float64, len(phases))
	for i, p := range phases[:len(phases)-1] {
		if len(p.edges) == 0 {
			continue
		}
		secs := p.window.Seconds()
		marginal[i] = net[i] - watch*float64(len(p.edges))*secs*1e6/float64(max(p.polls, 1))
		fmt.Fprintf(&b, "ratio %s / direct: net µs/poll %.3f, marginal (net of the edges' watching) %.3f\n", p.name,
			net[i]/direct, marginal[i]/direct)
	}
	t.Log(b.String())
	fmt.Print(b.String())
	for i, p := range phases {
		if !p.polling {
			continue
		}
		if aim := min(p.asked, float64(rate)) * p.window.Seconds(); float64(p.polls) < aim/4 {
			t.Errorf("%s: %d polls in %s, want at least a quarter of the %.0f aimed at", p.name, p.polls, p.window, aim)
		}
		if len(p.edges) == 0 {
			continue
		}
		if net[i] >= direct/2 {
			t.Errorf("%s: the leader spent %.1f µs a poll net of idle, direct %.1f; want under half", p.name, net[i], direct)
		}
		if marginal[i] >= direct/20 {
			t.Errorf("%s: the leader spent %.1f µs a poll net of idle and of the edges' watching, direct %.1f; want under 5 %%",
				p.name, marginal[i], direct)
		}
	}
}

// pollTable writes the phases side by side to b: the polls answered and the pace the buyers
// asked, the leader's CPU per poll (and net of its idle cost), the edges' (in all, and each
// edge's share of a core) and the load generator's. It returns each phase's leader's net µs
// per poll.
func pollTable(b *strings.Builder, buyers, rate int, phases []pollPhase, idle float64) []float64 {
	fmt.Fprintf(b, "POLL CPU: %d queued buyers polling at their retry_after_ms, at most %d polls/s in all, %s a phase, leader region-us, %d cores\n",
		buyers, rate, phases[0].window, runtime.NumCPU())
	fmt.Fprintf(b, "%-30s %7s %9s %6s %8s %8s %7s %8s %8s %7s %8s %7s %8s  %s\n", "phase", "polls", "by leader", "failed", "asked/s", "polls/s",
		"leader", "µs/poll", "net", "edges", "µs/poll", "loadgen", "µs/poll", "each edge")
	fmt.Fprintf(b, "%-30s %7s %9s %6s %8s %8s %7s %8s %8s %7s %8s %7s %8s  %s\n", "", "", "", "", "", "", "cores", "leader", "µs/poll",
		"cores", "edges", "cores", "loadgen", "cores")
	net := make([]float64, len(phases))
	for i, p := range phases {
		secs := p.window.Seconds()
		perPoll := func(d time.Duration) string {
			if p.polls == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f", float64(d.Microseconds())/float64(p.polls))
		}
		netS := "-"
		if p.polls > 0 {
			net[i] = (p.leader.Seconds() - idle*secs) * 1e6 / float64(p.polls)
			netS = fmt.Sprintf("%.1f", net[i])
		}
		each := make([]string, len(p.edges))
		for k, e := range p.edges {
			each[k] = fmt.Sprintf("%.3f", e.Seconds()/secs)
		}
		asked := "-"
		if p.polling {
			asked = fmt.Sprintf("%.0f", p.asked)
		}
		fmt.Fprintf(b, "%-30s %7d %9d %6d %8s %8.0f %7.3f %8s %8s %7.3f %8s %7.3f %8s  %s\n", p.name, p.polls, p.byLeader, p.fails, asked,
			float64(p.polls)/secs, p.leader.Seconds()/secs, perPoll(p.leader), netS, p.edge().Seconds()/secs, perPoll(p.edge()),
			p.gen.Seconds()/secs, perPoll(p.gen), strings.Join(each, " "))
	}
	return net
}
