package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/stat's counters: USER_HZ, 100 on every Linux architecture Go
// supports (the kernel scales its internal HZ to it for user space).
const userHZ = 100

// machineCPU is what the whole machine's CPUs did since boot: busy (user, nice, system, irq,
// softirq) and total (busy plus idle, iowait and steal), summed over every CPU.
type machineCPU struct {
	busy, total time.Duration
	ok          bool
}

// readMachineCPU reads /proc/stat; ok is false where there is none (not Linux).
func readMachineCPU() machineCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	m, err := parseProcStat(string(b))
	if err != nil {
		return machineCPU{}
	}
	return m
}

// parseProcStat reads the aggregate "cpu" line of /proc/stat. Guest time is already counted
// in user time, so it is not added again.
func parseProcStat(text string) (machineCPU, error) {
	line, _, _ := strings.Cut(text, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("/proc/stat: first line %q is not the aggregate cpu line", line)
	}
	var t [8]int64 // user nice system idle iowait irq softirq steal
	for i := range t {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || v < 0 {
			return machineCPU{}, fmt.Errorf("/proc/stat: cpu field %d is %q, want a count", i+1, f[i+1])
		}
		t[i] = v
	}
	tick := time.Second / userHZ
	busy := t[0] + t[1] + t[2] + t[5] + t[6]
	return machineCPU{busy: time.Duration(busy) * tick, total: time.Duration(busy+t[3]+t[4]+t[7]) * tick, ok: true}, nil
}

// since fills v's machine figures from the samples before and after its run.
func (m machineCPU) since(before machineCPU, v *VariantResult) {
	if !m.ok || !before.ok || v.Ops <= 0 {
		return
	}
	busy, total := m.busy-before.busy, m.total-before.total
	if total <= 0 {
		return
	}
	v.MachineBusyPct = round1(100 * float64(busy) / float64(total))
	v.MachineCPUPerOp = round1(float64(busy) / float64(time.Microsecond) / float64(v.Ops))
}

// Budget is (d)/(e) taken apart, over each variant's median: a rate is the machine's CPUs
// × the share of them busy ÷ the machine's CPU per operation, so
// (d)/(e) ≈ Utilization × Cost. "≈": the machine figures include the warm-up, the rates do not.
type Budget struct {
	BusyPctD         float64 `json:"machine_busy_pct_d"`
	BusyPctE         float64 `json:"machine_busy_pct_e"`
	MachineCPUPerOpD float64 `json:"machine_cpu_us_per_op_d"`
	MachineCPUPerOpE float64 `json:"machine_cpu_us_per_op_e"`
	ProcessCPUPerOpD float64 `json:"process_cpu_us_per_op_d"`
	ProcessCPUPerOpE float64 `json:"process_cpu_us_per_op_e"`
	// Utilization is BusyPctD / BusyPctE: how much more of the machine (d) kept busy.
	Utilization float64 `json:"utilization"`
	// Cost is MachineCPUPerOpE / MachineCPUPerOpD: what a no-op call costs the machine
	// against a reservation (PostgreSQL's share included).
	Cost float64 `json:"cost"`
}

// budgetOf is the Budget of the medians d and e, or nil when a figure is missing.
func budgetOf(d, e *VariantResult) *Budget {
	if d == nil || e == nil || d.MachineBusyPct <= 0 || e.MachineBusyPct <= 0 || d.MachineCPUPerOp <= 0 || e.MachineCPUPerOp <= 0 {
		return nil
	}
	return &Budget{
		BusyPctD: d.MachineBusyPct, BusyPctE: e.MachineBusyPct,
		MachineCPUPerOpD: d.MachineCPUPerOp, MachineCPUPerOpE: e.MachineCPUPerOp,
		ProcessCPUPerOpD: d.ProcessCPUPerOp, ProcessCPUPerOpE: e.ProcessCPUPerOp,
		Utilization: round3(d.MachineBusyPct / e.MachineBusyPct),
		Cost:        round3(e.MachineCPUPerOp / d.MachineCPUPerOp),
	}
}
