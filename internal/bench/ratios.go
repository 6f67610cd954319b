package bench

import (
	"fmt"
	"slices"
)

// Ratio is one comparison the issue sets a target for.
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

// compared are the variants (medians over the rounds) that one set of ratios compares; eAtD
// is (e) at (d)'s concurrency, for the latency target, which the issue sets "at the same
// concurrency".
type compared struct {
	b, c, d, e, eAtD, f *VariantResult
}

// throughput is what a variant is ranked by: reservations/s for the stock variants, calls/s
// for (e) and (f), which reserve nothing.
func throughput(v *VariantResult) float64 {
	if v.Variant == VariantNoop || v.Variant == VariantSoldOut {
		return v.OpsPerSec
	}
	return v.ReservationsPerSec
}

// finish computes the ratios whose variants all ran, over the variants' medians across the
// rounds. At one concurrency that is all. A sweep compares each variant at its own peak, the
// concurrency where its median throughput is highest, as the issue measures (e): the
// transport's ceiling, "tops out near". (d)'s p99 is compared with (e)'s at (d)'s peak
// concurrency. AtConcurrency has the same ratios at each concurrency alone, so that a
// reader sees what the peaks hide.
func (r *Report) finish() {
	ns := r.concurrencies()
	r.Ratios = []Ratio{}
	if len(ns) == 0 {
		return
	}
	peak := r.peaks(ns)
	if len(ns) == 1 {
		peak = r.at(ns[0])
	} else {
		for _, n := range ns {
			at := r.at(n)
			set := ConcurrencyRatios{Concurrency: n, Ratios: ratiosOf(at)}
			if at.c != nil {
				set.BestBuckets = at.c.Buckets
			}
			r.AtConcurrency = append(r.AtConcurrency, set)
		}
	}
	if peak.c != nil {
		r.BestBuckets = peak.c.Buckets
	}
	if len(ns) > 1 {
		r.Peaks = peaksOf(peak)
	}
	r.Ratios = ratiosOf(peak)
	r.Budget = budgetOf(peak.d, peak.e)
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
	x := compared{b: r.medianAt(VariantConditional, n), d: r.medianAt(VariantRegion, n), e: r.medianAt(VariantNoop, n),
		f: r.medianAt(VariantSoldOut, n)}
	x.c = r.bestBuckets([]int{n})
	x.eAtD = x.e
	return x
}

// peaks is every variant at its peak among ns; (c) is the best K at its best concurrency.
func (r *Report) peaks(ns []int) compared {
	x := compared{b: r.peak(VariantConditional, ns), d: r.peak(VariantRegion, ns), e: r.peak(VariantNoop, ns),
		f: r.peak(VariantSoldOut, ns)}
	x.c = r.bestBuckets(ns)
	if x.d != nil {
		x.eAtD = r.medianAt(VariantNoop, x.d.Concurrency)
	}
	return x
}

// peak is the variant's median at the concurrency among ns where its throughput is highest.
func (r *Report) peak(name string, ns []int) *VariantResult {
	var best *VariantResult
	for _, n := range ns {
		if m := r.medianAt(name, n); m != nil && (best == nil || throughput(m) > throughput(best)) {
			best = m
		}
	}
	return best
}

// bestBuckets is (c) at its best K and concurrency among ns.
func (r *Report) bestBuckets(ns []int) *VariantResult {
	var best *VariantResult
	for _, v := range r.Variants {
		if v.Buckets == 0 || v.Skipped != "" || !slices.Contains(ns, v.Concurrency) {
			continue
		}
		if m := r.medianAt(v.Variant, v.Concurrency); best == nil || throughput(m) > throughput(best) {
			best = m
		}
	}
	return best
}

// peaksOf is, in a sweep, the concurrency at which each compared variant peaked.
func peaksOf(x compared) map[string]int {
	out := map[string]int{}
	for _, v := range []*VariantResult{x.b, x.c, x.d, x.e, x.f} {
		if v != nil {
			out[v.Variant] = v.Concurrency
		}
	}
	return out
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
	}
	if x.d != nil && x.eAtD != nil {
		add("p99_d/p99_e", fmt.Sprintf("p99 latency of (d) region over p99 of (e) health check, both at %d callers", x.d.Concurrency),
			x.d.Latency.P99, x.eAtD.Latency.P99, 2, true)
	}
	if x.f != nil && x.e != nil {
		add("f/e", "calls/s of (f) sold-out Reserve over calls/s of (e) health check", x.f.OpsPerSec, x.e.OpsPerSec, 0.8, false)
	}
	return out
}
