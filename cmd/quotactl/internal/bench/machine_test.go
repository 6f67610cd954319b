package bench

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name, text  string
		busy, total time.Duration
		err         string
	}{
		{name: "kernel 6", text: "cpu  100 20 30 400 50 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\n",
			busy: 1630 * time.Millisecond, total: 6210 * time.Millisecond},
		{name: "no guest columns", text: "cpu 1 0 0 1 0 0 0 0\n", busy: 10 * time.Millisecond, total: 20 * time.Millisecond},
		{name: "per-cpu line first", text: "cpu0 1 2 3 4 5 6 7 8\n", err: "not the aggregate"},
		{name: "too few fields", text: "cpu 1 2 3\n", err: "not the aggregate"},
		{name: "not a number", text: "cpu 1 2 x 4 5 6 7 8\n", err: `field 3 is "x"`},
		{name: "negative", text: "cpu 1 2 3 -4 5 6 7 8\n", err: `field 4 is "-4"`},
		{name: "empty", text: "", err: "not the aggregate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseProcStat(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || !m.ok || m.busy != tc.busy || m.total != tc.total {
				t.Fatalf("got %+v, %v; want busy %v total %v", m, err, tc.busy, tc.total)
			}
		})
	}
}

// TestMachineFigures: busy share and CPU per operation from two samples; nothing from a
// missing sample, no operations or no elapsed time.
func TestMachineFigures(t *testing.T) {
	before := machineCPU{busy: 10 * time.Second, total: 40 * time.Second, ok: true}
	after := machineCPU{busy: 13 * time.Second, total: 44 * time.Second, ok: true}
	v := VariantResult{Ops: 100_000}
	after.since(before, &v)
	if v.MachineBusyPct != 75 || v.MachineCPUPerOp != 30 {
		t.Fatalf("busy %v %%, %v µs/op; want 75 %% and 30 µs/op", v.MachineBusyPct, v.MachineCPUPerOp)
	}
	for _, tc := range []struct {
		name          string
		before, after machineCPU
		ops           int64
	}{
		{"no first sample", machineCPU{}, after, 100},
		{"no second sample", before, machineCPU{}, 100},
		{"no operations", before, after, 0},
		{"no time passed", before, before, 100},
	} {
		v := VariantResult{Ops: tc.ops}
		tc.after.since(tc.before, &v)
		if v.MachineBusyPct != 0 || v.MachineCPUPerOp != 0 {
			t.Errorf("%s: got %v %%, %v µs/op; want nothing", tc.name, v.MachineBusyPct, v.MachineCPUPerOp)
		}
	}
}

// TestBudget: (d)/(e) taken apart into utilization × cost, and no budget without figures.
func TestBudget(t *testing.T) {
	d := &VariantResult{MachineBusyPct: 72, MachineCPUPerOp: 48, ProcessCPUPerOp: 36}
	e := &VariantResult{MachineBusyPct: 80, MachineCPUPerOp: 18, ProcessCPUPerOp: 17.5}
	b := budgetOf(d, e)
	if b == nil || b.Utilization != 0.9 || b.Cost != 0.375 || b.ProcessCPUPerOpD != 36 || b.MachineCPUPerOpE != 18 {
		t.Fatalf("budget %+v; want utilization 0.9, cost 0.375", b)
	}
	if budgetOf(d, &VariantResult{MachineCPUPerOp: 18}) != nil || budgetOf(nil, e) != nil {
		t.Fatal("a budget without (e)'s busy share, or without (d)")
	}
}

// TestReadMachineCPU: on Linux the real /proc/stat parses and moves forward.
func TestReadMachineCPU(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); runtime.GOOS != "linux" || err != nil {
		if m := readMachineCPU(); m.ok {
			t.Fatalf("no /proc/stat here, yet read %+v", m)
		}
		return
	}
	a := readMachineCPU()
	deadline := time.Now().Add(2 * time.Second)
	for x := 0; time.Now().Before(deadline); x++ { // burn CPU until a tick is counted
		if b := readMachineCPU(); b.busy > a.busy {
			if !a.ok || b.total < b.busy || b.total <= a.total {
				t.Fatalf("samples %+v then %+v", a, b)
			}
			return
		}
	}
	t.Fatalf("/proc/stat counted no busy time in 2 s of spinning: %+v", a)
}
