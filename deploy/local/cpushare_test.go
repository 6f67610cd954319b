package local_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuSnap is the CPU time so far of each of a cluster's processes (by name), of every
// PostgreSQL process together ("postgres"), of this test process ("load"), and of the whole
// machine ("machine", every core's busy time).
type cpuSnap map[string]time.Duration

// snapCPU reads a cpuSnap of c: its processes from their pid files, PostgreSQL's from /proc.
func (c *localCluster) snapCPU(t *testing.T) cpuSnap {
	t.Helper()
	s := cpuSnap{"load": cpuOf(t, os.Getpid()), "machine": machineBusy(t)}
	pids, err := filepath.Glob(filepath.Join(c.dir, "*.pid"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		name := strings.TrimSuffix(filepath.Base(p), ".pid")
		if d, err := procCPU(c.pidOf(name)); err == nil { // a process that is gone has no figure
			s[name] = d
		}
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "postgres" {
			if d, err := procCPU(pid); err == nil { // gone by now: it counts for nothing
				s["postgres"] += d
			}
		}
	}
	return s
}

// machineBusy is every core's busy time so far (/proc/stat's cpu line less idle and iowait).
func machineBusy(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %q", line)
		}
		if i != 3 && i != 4 && i < 8 { // idle, iowait; guest time is counted in user already
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / clockTicks
}

// cpuReport is where the CPU went between two snaps over window: cores used by each
// process (the busiest first), by PostgreSQL, by the load and by the whole machine.
func cpuReport(before, after cpuSnap, window time.Duration) string {
	type use struct {
		name  string
		cores float64
	}
	var uses []use
	for name, a := range after {
		b, ok := before[name]
		if !ok {
			continue // started within the window
		}
		uses = append(uses, use{name, (a - b).Seconds() / window.Seconds()})
	}
	slices.SortFunc(uses, func(x, y use) int {
		if x.cores != y.cores {
			if x.cores > y.cores {
				return -1
			}
			return 1
		}
		return strings.Compare(x.name, y.name)
	})
	var b strings.Builder
	for _, u := range uses {
		fmt.Fprintf(&b, " %s %.2f", u.name, u.cores)
	}
	return fmt.Sprintf("cores used over %s:%s", window.Round(time.Millisecond), b.String())
}

// histSnap is one histogram's cumulative bucket counts by upper bound ("0.05", "+Inf"),
// from a process's /metrics: the series whose name is metric+"_bucket" and whose labels
// contain labels.
type histSnap map[string]float64

// metricLines are the lines of the Prometheus exposition at url's /metrics; nil when it does
// not answer, or not 200.
func metricLines(hc *http.Client, url string) []string {
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	return strings.Split(string(b), "\n")
}

// scrapeHist reads histSnap of metric (series matching labels) at url's /metrics; nil when
// it does not answer.
func scrapeHist(hc *http.Client, url, metric, labels string) histSnap {
	lines := metricLines(hc, url)
	if lines == nil {
		return nil
	}
	h := histSnap{}
	for _, l := range lines {
		if !strings.HasPrefix(l, metric+"_bucket{") || !strings.Contains(l, labels) {
			continue
		}
		_, rest, _ := strings.Cut(l, `le="`)
		le, val, _ := strings.Cut(rest, `"} `)
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			h[le] += v
		}
	}
	return h
}

// over is how many observations between before and after took longer than le seconds, of
// how many in all.
func over(before, after histSnap, le string) (n, all float64) {
	all = after["+Inf"] - before["+Inf"]
	return all - (after[le] - before[le]), all
}

// stallReport says, of a region's writer batches and the reservations its HTTP listener
// answered between two scrapes of its leader, how many took over 50, 100 and 250 ms.
func stallReport(b, a map[string]histSnap) string {
	var out strings.Builder
	for _, what := range []string{"batches", "reserves"} {
		if b[what] == nil || a[what] == nil {
			fmt.Fprintf(&out, " %s: not scraped", what)
			continue
		}
		_, all := over(b[what], a[what], "+Inf")
		fmt.Fprintf(&out, " %s %.0f:", what, all)
		for _, le := range []struct{ bound, ms string }{{"0.05", "50"}, {"0.1", "100"}, {"0.25", "250"}} {
			n, _ := over(b[what], a[what], le.bound)
			fmt.Fprintf(&out, " >%sms %.0f", le.ms, n)
		}
	}
	return out.String()
}

// regionStalls scrapes each region's leader: its writer's batch times and its HTTP
// listener's reservation times.
func (c *localCluster) regionStalls(hc *http.Client) map[string]map[string]histSnap {
	out := map[string]map[string]histSnap{}
	for _, r := range wanRegions {
		url := "https://" + c.addr(r.offset+httpOffset)
		out[r.name] = map[string]histSnap{
			"batches":  scrapeHist(hc, url, "quota_batch_commit_seconds", ""),
			"reserves": scrapeHist(hc, url, "quota_http_request_duration_seconds", `reservations"`),
		}
	}
	return out
}
