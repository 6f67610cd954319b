package bench

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"time"

	"github.com/google/pprof/profile"
	"github.com/quotaworks/quota/cmd/internal/cluster"
)

// componentOther names the CPU of goroutines no cluster component started: the bench's own,
// and the Go runtime's (its background collector's mark workers carry no label), so each
// component's figure leaves out its share of the collector.
const componentOther = "other"

// profileComponents profiles this process's CPU for d and returns each component's CPU in
// % of one core, told apart by the label the in-process cluster puts on its goroutines
// (cluster.ComponentLabel: "coordinator", "region/us", "etcd", ...; unlabeled: "other").
// The profile samples at 100 Hz: over a 30 s window one sample is 0.03 % of a core, and a
// component at 5 % of a core (150 samples) is known to about ± 0.4 % (the samples' square
// root). It fails if a CPU profile is already being taken.
func profileComponents(ctx context.Context, d time.Duration) (map[string]float64, error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return nil, fmt.Errorf("CPU profile by component: %w", err)
	}
	start := time.Now()
	err := sleepCtx(ctx, d)
	pprof.StopCPUProfile()
	if err != nil {
		return nil, err
	}
	return cpuByComponent(&buf, time.Since(start))
}

// cpuByComponent sums a CPU profile's samples by component, in % of one core over window.
func cpuByComponent(buf *bytes.Buffer, window time.Duration) (map[string]float64, error) {
	p, err := profile.Parse(buf)
	if err != nil {
		return nil, fmt.Errorf("CPU profile by component: %w", err)
	}
	col := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			col = i
		}
	}
	if col < 0 {
		return nil, fmt.Errorf("CPU profile by component: no cpu/nanoseconds sample type in %v", p.SampleType)
	}
	ns := map[string]int64{}
	for _, s := range p.Sample {
		c := componentOther
		if v := s.Label[cluster.ComponentLabel]; len(v) > 0 {
			c = v[0]
		}
		ns[c] += s.Value[col]
	}
	out := map[string]float64{}
	for c, v := range ns {
		out[c] = round1(100 * float64(v) / float64(window.Nanoseconds()))
	}
	return out, nil
}
