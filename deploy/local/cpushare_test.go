package local_test

import (
	"fmt"
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
		if pid := c.pidOf(name); processAlive(pid) {
			s[name] = cpuOf(t, pid)
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
			s["postgres"] += cpuOfGone(pid)
		}
	}
	return s
}

// processAlive says whether pid names a running process.
func processAlive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil
}

// cpuOfGone is pid's CPU time, or 0 when it is gone by the time it is read.
func cpuOfGone(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // a field that does not parse counts as 0: a figure, not a check
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
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
