package bench

import (
	"math"
	"slices"
	"time"
)

// Latency summarises the measured operations' latencies of one variant, in milliseconds.
// Quantiles are exact (nearest rank over every measured sample), not estimated.
type Latency struct {
	Samples int     `json:"samples"`
	Mean    float64 `json:"mean_ms"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	P999    float64 `json:"p999_ms"`
	Max     float64 `json:"max_ms"`
}

// recorder collects one worker's latency samples; each worker has its own, so recording
// takes no lock. The samples are merged and sorted once, after the run.
type recorder struct {
	samples []time.Duration
}

func (r *recorder) add(d time.Duration) { r.samples = append(r.samples, d) }

// merge concatenates the workers' samples and sorts them.
func merge(parts []recorder) []time.Duration {
	n := 0
	for _, p := range parts {
		n += len(p.samples)
	}
	all := make([]time.Duration, 0, n)
	for _, p := range parts {
		all = append(all, p.samples...)
	}
	slices.Sort(all)
	return all
}

// quantile is the nearest-rank q-quantile (0 < q ≤ 1) of sorted samples: the smallest
// sample with at least q of all samples at or below it. It is 0 without samples.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q*float64(len(sorted)))) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// summarize computes the latency summary of sorted samples.
func summarize(sorted []time.Duration) Latency {
	if len(sorted) == 0 {
		return Latency{}
	}
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	return Latency{
		Samples: len(sorted),
		Mean:    round3(ms(sum / time.Duration(len(sorted)))),
		P50:     round3(ms(quantile(sorted, 0.50))),
		P99:     round3(ms(quantile(sorted, 0.99))),
		P999:    round3(ms(quantile(sorted, 0.999))),
		Max:     round3(ms(sorted[len(sorted)-1])),
	}
}

// round1 keeps one decimal.
func round1(x float64) float64 { return math.Round(x*10) / 10 }

// round3 keeps three decimals (microseconds when the unit is milliseconds).
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// rate is n events per second over d, rounded to one decimal; 0 when d is not positive.
func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return math.Round(float64(n)/d.Seconds()*10) / 10
}
