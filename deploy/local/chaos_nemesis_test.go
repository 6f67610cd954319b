package local_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// fault is one active fault: what it is and how to undo it.
type fault struct {
	kind   string // kill, pause, cut, blackhole, slow
	target string // a process, or a link ("region-us/pg")
	until  time.Time
}

// nemesis injects faults every few seconds from a seeded RNG: kill -9 and restart, SIGSTOP
// past the lease and SIGCONT, a link cut (proxy stopped), blackholed (bytes dropped) or slowed
// (latency) and healed. At
// most maxActive faults at once, one per process, and never more than one etcd member down.
type nemesis struct {
	t      *testing.T
	c      *localCluster
	links  *links
	rng    *mrand.Rand
	active map[string]fault // by process
	counts map[string]int
	mu     sync.Mutex
	errs   []string
	log    []string
	// resolve names where a region answers now
	resolve func(ctx context.Context, region string) string
}

const maxActive = 2

func newNemesis(t *testing.T, c *localCluster, l *links, seed uint64, resolve func(context.Context, string) string) *nemesis {
	return &nemesis{t: t, c: c, links: l, rng: mrand.New(mrand.NewPCG(seed, 0x9e3779b9)),
		active: map[string]fault{}, counts: map[string]int{}, resolve: resolve}
}

// run acts until ctx ends, then undoes every fault it left.
func (n *nemesis) run(ctx context.Context, start time.Time) {
	for ctx.Err() == nil {
		wait := time.Duration(2000+n.rng.IntN(3000)) * time.Millisecond
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		now := time.Now()
		for _, p := range n.activeNames() {
			if f := n.active[p]; ctx.Err() == nil && now.After(f.until) {
				n.undo(p, f, start)
			}
		}
		if ctx.Err() == nil && len(n.active) < maxActive {
			n.inject(start)
		}
	}
	n.healAll(start)
}

// inject picks a fault and a target that is free.
func (n *nemesis) inject(start time.Time) {
	kinds := []string{"kill", "kill", "pause", "pause", "cut", "blackhole", "blackhole", "slow"}
	kind := kinds[n.rng.IntN(len(kinds))]
	var target, proc string
	leaders := n.regionLeaders()
	for range 20 {
		switch {
		case len(leaders) > 0 && n.rng.IntN(100) < 60: // mostly where the work is
			proc = leaders[n.rng.IntN(len(leaders))]
		case kind == "kill" || kind == "pause":
			proc = processes[n.rng.IntN(len(processes))]
		default:
			proc = linkProcs[n.rng.IntN(len(linkProcs))]
		}
		target = proc
		if kind == "cut" || kind == "blackhole" || kind == "slow" {
			target = proc + []string{"/pg", "/pg", "/etcd"}[n.rng.IntN(3)]
		}
		if n.free(proc) {
			break
		}
		proc = ""
	}
	if proc == "" {
		return
	}
	f := fault{kind: kind, target: target, until: time.Now().Add(time.Duration(2000+n.rng.IntN(6000)) * time.Millisecond)}
	var err error
	switch kind {
	case "kill":
		_, err = n.c.run(30*time.Second, n.c.script, "kill", proc)
	case "pause":
		_, err = n.c.run(30*time.Second, n.c.script, "pause", proc)
	case "cut":
		n.links.cut(target)
	case "blackhole":
		err = n.links.blackhole(target)
	case "slow":
		err = n.links.slow(target, time.Duration(200+n.rng.IntN(1300))*time.Millisecond)
	}
	n.note(start, "%s %s (for %s)", kind, target, time.Until(f.until).Round(100*time.Millisecond))
	if err != nil {
		n.fail("%s %s: %v", kind, target, err)
		return
	}
	n.active[proc] = f
	n.counts[kind]++
}

// regionLeaders names the processes that lead a region now, as the coordinators list them
// (sorted; none when neither coordinator answers).
func (n *nemesis) regionLeaders() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var names []string
	for i, r := range []string{"us", "eu", "ap"} {
		addr := n.resolve(ctx, r)
		for _, p := range []struct {
			name string
			off  int
		}{{"region-" + r, 1 + i}, {"region-" + r + "-2", 11 + i}} {
			if addr == n.c.addr(p.off) {
				names = append(names, p.name)
			}
		}
	}
	return names
}

// free: proc has no fault, and a fault on an etcd member leaves the other two alone.
func (n *nemesis) free(proc string) bool {
	if _, busy := n.active[proc]; busy {
		return false
	}
	if strings.HasPrefix(proc, "etcd") {
		for p := range n.active {
			if strings.HasPrefix(p, "etcd") {
				return false
			}
		}
	}
	return true
}

func (n *nemesis) undo(proc string, f fault, start time.Time) {
	var (
		out string
		err error
	)
	switch f.kind {
	case "kill":
		out, err = n.c.run(2*time.Minute, n.c.script, "start", proc)
	case "pause":
		out, err = n.c.run(30*time.Second, n.c.script, "resume", proc)
	default:
		err = n.links.heal(f.target)
	}
	n.note(start, "undo %s %s", f.kind, f.target)
	if err != nil {
		n.fail("undo %s %s: %v\n%s", f.kind, f.target, err, out)
	}
	delete(n.active, proc)
}

func (n *nemesis) healAll(start time.Time) {
	for _, p := range n.activeNames() {
		n.undo(p, n.active[p], start)
	}
}

// activeNames: the faulted processes, sorted (so that a seed replays the same choices).
func (n *nemesis) activeNames() []string {
	names := make([]string, 0, len(n.active))
	for p := range n.active {
		names = append(names, p)
	}
	sort.Strings(names)
	return names
}

func (n *nemesis) note(start time.Time, format string, args ...any) {
	line := fmt.Sprintf("%6.1fs ", time.Since(start).Seconds()) + fmt.Sprintf(format, args...)
	n.mu.Lock()
	n.log = append(n.log, line)
	n.mu.Unlock()
	n.t.Log("nemesis: " + line)
}

func (n *nemesis) fail(format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.errs = append(n.errs, fmt.Sprintf(format, args...))
}
