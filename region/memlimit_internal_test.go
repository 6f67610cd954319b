package region

import (
	"bytes"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
)

// A leader whose loaded state takes most of the process's memory limit says so, naming the
// flag to raise; under a roomy limit, or none, it says nothing.
func TestLoadWarnsNearTheMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	var out bytes.Buffer
	r := &Region{cfg: Config{Name: "us", Logger: slog.New(slog.NewTextHandler(&out, nil))}}

	debug.SetMemoryLimit(1 << 20) // far below any test binary's live heap
	warnNearMemoryLimit(&r.cfg, 42)
	if got := out.String(); !strings.Contains(got, "--memory-limit") || !strings.Contains(got, "holds=42") {
		t.Fatalf("no warning under a 1 MiB limit; logged %q", got)
	}
	out.Reset()
	debug.SetMemoryLimit(1 << 40)
	warnNearMemoryLimit(&r.cfg, 42)
	debug.SetMemoryLimit(prev)
	warnNearMemoryLimit(&r.cfg, 42)
	if out.Len() != 0 {
		t.Fatalf("warned under a roomy limit or none: %q", out.String())
	}
}

// The live heap the last collection measured may be from before the state grew (a load ends
// with no collection): a state grown since, that comes near the limit, is still warned of.
func TestLoadWarnsOfAStateGrownSinceTheLastCollection(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection while the state grows
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	before := s[0].Value.Uint64()
	state := make([]byte, 64<<20) // the "state", live, and not yet measured by a collection
	for i := range state {
		state[i] = 1
	}
	metrics.Read(s)
	if s[0].Value.Uint64() != before {
		t.Fatalf("test setup: a collection ran while the state grew (live heap %d → %d), with the collector off", before, s[0].Value.Uint64())
	}
	// A limit whose warning share lies 48 MiB above the last measure and 16 MiB below the
	// state with the rest of the heap (room for the heap to shrink meanwhile), while the heap
	// as a whole stays under the limit, so that the limit itself starts no collection.
	var out bytes.Buffer
	r := &Region{cfg: Config{Name: "us", Logger: slog.New(slog.NewTextHandler(&out, nil))}}
	limit := int64(float64(before+48<<20) / memoryLimitWarnShare)
	debug.SetMemoryLimit(limit)
	warnNearMemoryLimit(&r.cfg, 7)
	runtime.KeepAlive(state)
	if got := out.String(); !strings.Contains(got, "--memory-limit") || !strings.Contains(got, "holds=7") {
		t.Fatalf("no warning for a %d MiB state under a %d MiB limit (last measured live heap %d MiB); logged %q",
			len(state)>>20, limit>>20, before>>20, got)
	}
}

// A standby's warm copy takes as much memory as the leader's state: near the limit, the
// standby says so when it loads the copy, not only once it takes over.
func TestStandbyCopyWarnsNearTheMemoryLimit(t *testing.T) {
	old, ctx := newInternalRegion(t)
	mustReserveIn(t, old, ctx, "ann", "k1", 1)
	var out bytes.Buffer
	sb, err := New(Config{Name: "us", Clock: old.cfg.Clock, Logger: slog.New(slog.NewTextHandler(&out, nil))}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Close)
	prev := debug.SetMemoryLimit(1 << 20) // far below any test binary's live heap
	sb.refreshWarm(ctx)
	debug.SetMemoryLimit(prev)
	if got := out.String(); sb.warm == nil || !strings.Contains(got, "--memory-limit") || !strings.Contains(got, "holds=1") {
		t.Fatalf("a standby's copy under a 1 MiB limit: copy loaded %v, logged %q", sb.warm != nil, got)
	}
}
