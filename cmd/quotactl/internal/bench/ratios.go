package bench

import (
	"fmt"
	"slices"
)

// Ratio is one comparison that has a target.
type Ratio struct {
	Name    string  `json:"name"`
	Meaning string  `json:"meaning"`
	Value   float64 `json:"value"`
	// Target is the bound Value must reach: at least Target, or at most when AtMost.
	Target float64 `json:"target"`
	AtMost bool    `json:"at_most,omitempty"`
	Met    bool    `json:"met"`
}

// ConcurrencyRatios are the ratios of one concurrency of a sweep, each variant at it.
type ConcurrencyRatios struct {
	Concurrency int     `json:"concurrency"`
	BestBuckets int     `json:"best_buckets,omitempty"`
	Ratios      []Ratio `json:"ratios"`
}

// compared are the variants (medians over the rounds) that one set of ratios compares, all
// at one concurrency.
type compared struct {
	b, c, d, e, f, g, h, i, j *VariantResult
}

// finish computes the ratios whose variants all ran, over the variants' medians across the
// rounds, every variant at the same concurrency, as the targets' comparison is. At one
// concurrency that is all. A sweep takes them at the benchmark's peak, the concurrency where
// (d)'s median reservations/s is highest (the first concurrency when (d) did not run), and
// keeps them at every concurrency too (AtConcurrency), so that a reader sees all of them.
func (r *Report) finish() {
	ns := r.concurrencies()
	r.Ratios = []Ratio{}
	if len(ns) == 0 {
		return
	}
	peak := ns[0]
	if d := r.peak(VariantRegion, ns); d != nil {
		peak = d.Concurrency
	}
	if len(ns) > 1 {
		r.PeakConcurrency = peak
		for _, n := range ns {
			at := r.at(n)
			set := ConcurrencyRatios{Concurrency: n, Ratios: ratiosOf(at)}
			if at.c != nil {
				set.BestBuckets = at.c.Buckets
			}
			r.AtConcurrency = append(r.AtConcurrency, set)
		}
	}
	x := r.at(peak)
	if x.c != nil {
		r.BestBuckets = x.c.Buckets
	}
	r.Ratios = ratiosOf(x)
	r.Budget = budgetOf(x.d, x.e)
	r.Binding = bindingOf(x.d, x.j)
}

// BindingCost is (d) beside (j), over each variant's median at the ratios' concurrency: what
// binding a buyer to the region in etcd at their first reservation costs, every call of (d)
// being a new buyer's first. It has no target: the binding is what makes the per-user limit
// hold across regions in a sale without a waiting room.
type BindingCost struct {
	Concurrency int `json:"concurrency"`
	// PerSecD and PerSecJ are the reservations/s with the binding (d) and without (j);
	// Ratio is PerSecD / PerSecJ.
	PerSecD float64 `json:"reservations_per_sec_d"`
	PerSecJ float64 `json:"reservations_per_sec_j"`
	Ratio   float64 `json:"d_over_j"`
	// P99D and P99J are the p99 latencies, in ms.
	P99D float64 `json:"p99_ms_d"`
	P99J float64 `json:"p99_ms_j"`
	// ProcessCPUPerOpD and ProcessCPUPerOpJ are the bench process's CPU per reservation, in
	// µs (clients, region, coordinator and etcd alike).
	ProcessCPUPerOpD float64 `json:"process_cpu_us_per_op_d"`
	ProcessCPUPerOpJ float64 `json:"process_cpu_us_per_op_j"`
}

// bindingOf is the BindingCost of the medians d and j, or nil when either is missing.
func bindingOf(d, j *VariantResult) *BindingCost {
	if d == nil || j == nil || j.ReservationsPerSec <= 0 {
		return nil
	}
	return &BindingCost{Concurrency: d.Concurrency, PerSecD: d.ReservationsPerSec, PerSecJ: j.ReservationsPerSec,
		Ratio: round3(d.ReservationsPerSec / j.ReservationsPerSec), P99D: d.Latency.P99, P99J: j.Latency.P99,
		ProcessCPUPerOpD: d.ProcessCPUPerOp, ProcessCPUPerOpJ: j.ProcessCPUPerOp}
}

// concurrencies are the distinct concurrencies the variants ran at, in the order they ran.
func (r *Report) concurrencies() []int {
	var ns []int
	for _, v := range r.Variants {
		if !slices.Contains(ns, v.Concurrency) {
			ns = append(ns, v.Concurrency)
		}
	}
	return ns
}

// at is every variant at n callers; (c) is its best K there.
func (r *Report) at(n int) compared {
	return compared{b: r.medianAt(VariantConditional, n), c: r.bestBuckets(n), d: r.medianAt(VariantRegion, n),
		e: r.medianAt(VariantNoop, n), f: r.medianAt(VariantSoldOut, n), g: r.medianAt(VariantRedisAlways, n),
		h: r.medianAt(VariantRedisEverysec, n), i: r.medianAt(VariantRegionBare, n), j: r.medianAt(VariantRegionUnbound, n)}
}

// peak is the variant's median at the concurrency among ns where its throughput is highest.
func (r *Report) peak(name string, ns []int) *VariantResult {
	var best *VariantResult
	for _, n := range ns {
		if m := r.medianAt(name, n); m != nil && (best == nil || m.ReservationsPerSec > best.ReservationsPerSec) {
			best = m
		}
	}
	return best
}

// bestBuckets is (c) at its best K at n callers.
func (r *Report) bestBuckets(n int) *VariantResult {
	var best *VariantResult
	for _, v := range r.Variants {
		if v.Buckets == 0 || v.Skipped != "" || v.Concurrency != n {
			continue
		}
		if m := r.medianAt(v.Variant, n); best == nil || m.ReservationsPerSec > best.ReservationsPerSec {
			best = m
		}
	}
	return best
}

// ratiosOf computes the ratios of x whose variants ran.
func ratiosOf(x compared) []Ratio {
	out := []Ratio{}
	add := func(name, meaning string, num, den, target float64, atMost bool) {
		if den <= 0 {
			return
		}
		r := Ratio{Name: name, Meaning: meaning, Value: round3(num / den), Target: target, AtMost: atMost}
		r.Met = r.Value >= target
		if atMost {
			r.Met = r.Value <= target
		}
		out = append(out, r)
	}
	if x.d != nil && x.b != nil {
		add("d/b", "reservations/s of (d) region over (b) conditional UPDATE", x.d.ReservationsPerSec, x.b.ReservationsPerSec, 10, false)
	}
	if x.d != nil && x.c != nil {
		add("d/best_c", fmt.Sprintf("reservations/s of (d) region over (c) with the best K (%d)", x.c.Buckets),
			x.d.ReservationsPerSec, x.c.ReservationsPerSec, 2, false)
	}
	if x.d != nil && x.e != nil {
		add("d/e", "reservations/s of (d) region over calls/s of (e) health check", x.d.ReservationsPerSec, x.e.OpsPerSec, 0.5, false)
		add("p99_d/p99_e", "p99 latency of (d) region over p99 of (e) health check", x.d.Latency.P99, x.e.Latency.P99, 2, true)
	}
	if x.f != nil && x.e != nil {
		add("f/e", "calls/s of (f) sold-out Reserve over calls/s of (e) health check", x.f.OpsPerSec, x.e.OpsPerSec, 0.8, false)
	}
	if x.d != nil && x.g != nil {
		add("d/g", "reservations/s of (d) region over (g) Redis Lua take, appendfsync always", x.d.ReservationsPerSec, x.g.ReservationsPerSec, 1, false)
	}
	if x.d != nil && x.i != nil {
		add("d/i", "reservations/s of (d) region over (i) the same region without metrics", x.d.ReservationsPerSec, x.i.ReservationsPerSec, 0.95, false)
	}
	if x.d != nil && x.h != nil {
		add("d/h", "reservations/s of (d) region over (h) Redis Lua take, appendfsync everysec", x.d.ReservationsPerSec, x.h.ReservationsPerSec, 0.6, false)
	}
	return out
}
