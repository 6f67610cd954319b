package bench

import (
	"context"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
)

// TestProfileComponents spins one goroutine labeled as a component and one unlabeled while
// the process is profiled: each shows under its own name, and a second profile at once is
// refused rather than mixed into the first.
func TestProfileComponents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	spin := func() {
		defer wg.Done()
		for ctx.Err() == nil {
		}
	}
	wg.Add(2)
	pprof.Do(ctx, pprof.Labels(cluster.ComponentLabel, "coordinator"), func(context.Context) { go spin() })
	go spin()
	type result struct {
		pct map[string]float64
		err error
	}
	first := make(chan result, 1)
	go func() {
		pct, err := profileComponents(context.Background(), 600*time.Millisecond)
		first <- result{pct, err}
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := profileComponents(context.Background(), time.Millisecond); err == nil {
		t.Error("a second profile while one runs: want an error")
	}
	r := <-first
	cancel()
	wg.Wait()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.pct["coordinator"] <= 0 || r.pct[componentOther] <= 0 {
		t.Errorf("CPU by component %v: want the labeled spinner under coordinator and the other under %q", r.pct, componentOther)
	}
	for c := range r.pct {
		if c != "coordinator" && c != componentOther {
			t.Errorf("CPU by component %v: unexpected component %q", r.pct, c)
		}
	}
}
