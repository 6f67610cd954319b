package bench

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quotaworks/quota/transfer"
)

// outcome is how one operation ended.
type outcome int

const (
	took     outcome = iota // a unit was reserved
	refused                 // the stock is gone (sold out, REGION_EXHAUSTED)
	answered                // a no-op call answered as expected
	failed                  // an error
)

// attempt runs one operation; n is its sequence number in the variant, distinct for every
// operation (users are named after it).
type attempt func(ctx context.Context, n int64) (outcome, error)

// load is how a variant is driven: concurrency workers, each running attempts back to back
// until the stock is gone (when stopWhenRefused), maxOps attempts were started, or duration
// passed since the start.
type load struct {
	concurrency     int
	maxOps          int64
	duration        time.Duration
	warmup          time.Duration
	warmupOps       int64
	stopWhenRefused bool
	// newAttempt builds worker w's attempt function (each worker has its own, e.g. its own rng).
	newAttempt func(w int) attempt
}

// stockLoad drives a variant that sells cfg.Stock units until sold out.
func (c *Config) stockLoad(a func(w int) attempt) load {
	return load{concurrency: c.Concurrency, maxOps: 2*int64(c.Stock) + int64(c.Concurrency), duration: c.Duration,
		warmup: c.Warmup, warmupOps: c.WarmupOps, stopWhenRefused: true, newAttempt: a}
}

// probeLoad drives a variant that makes cfg.ProbeOps calls.
func (c *Config) probeLoad(a func(w int) attempt) load {
	return load{concurrency: c.Concurrency, maxOps: c.ProbeOps, duration: c.Duration, warmup: c.Warmup,
		warmupOps: min(c.WarmupOps, c.ProbeOps/10), newAttempt: a}
}

// workerStats is what one worker measured after warm-up; only that worker writes it.
type workerStats struct {
	rec          recorder
	counts       [4]int64 // by outcome, warm-up included
	measured     int64
	measuredTook int64
	lastEnd      time.Duration // of the last measured operation, since the start
	firstErr     error
}

type loadRun struct {
	load
	start    time.Time
	next     atomic.Int64
	done     atomic.Int64 // operations completed while warming up
	warm     atomic.Bool
	warmEnd  atomic.Int64 // since start, ns
	endOnce  sync.Once
	endedBy  string
	workers  []workerStats
	stopping atomic.Bool
}

// run drives the load and returns its totals.
func (l load) run(ctx context.Context) VariantResult {
	cpu0, mach0 := processCPU(), readMachineCPU()
	r := &loadRun{load: l, start: time.Now(), workers: make([]workerStats, l.concurrency)}
	if l.warmup <= 0 && l.warmupOps <= 0 {
		r.warm.Store(true)
	}
	var wg sync.WaitGroup
	for w := range l.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker(ctx, w)
		}()
	}
	wg.Wait()
	v := r.result()
	if v.Ops > 0 {
		v.ProcessCPUPerOp = round1(float64(processCPU()-cpu0) / float64(time.Microsecond) / float64(v.Ops))
	}
	readMachineCPU().since(mach0, &v)
	return v
}

// processCPU is the user and system CPU time this process has used (0 where unknown).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r *loadRun) end(why string) {
	r.endOnce.Do(func() { r.endedBy = why })
	r.stopping.Store(true)
}

// proceed says whether a worker may start another attempt.
func (r *loadRun) proceed(ctx context.Context) bool {
	switch {
	case r.stopping.Load():
		return false
	case ctx.Err() != nil:
		r.end("canceled")
	case time.Since(r.start) >= r.duration:
		r.end("duration")
	default:
		return true
	}
	return false
}

func (r *loadRun) worker(ctx context.Context, w int) {
	try := r.newAttempt(w)
	ws := &r.workers[w]
	for r.proceed(ctx) {
		n := r.next.Add(1) - 1
		if n >= r.maxOps {
			r.end("ops")
			return
		}
		t0 := time.Now()
		out, err := try(ctx, n)
		t1 := time.Now()
		ws.counts[out]++
		if out == failed && ws.firstErr == nil {
			ws.firstErr = err
		}
		if r.measured(t1.Sub(r.start)) {
			ws.rec.add(t1.Sub(t0))
			ws.measured++
			if out == took {
				ws.measuredTook++
			}
			ws.lastEnd = t1.Sub(r.start)
		}
		if out == refused && r.stopWhenRefused {
			r.end("sold out")
		}
	}
}

// measured says whether an operation that ended at since (from the start) counts: once the
// warm-up has ended, every completion does.
func (r *loadRun) measured(since time.Duration) bool {
	if r.warm.Load() {
		return true
	}
	if n := r.done.Add(1); n >= r.warmupOps || since >= r.warmup {
		if r.warm.CompareAndSwap(false, true) {
			r.warmEnd.Store(int64(since))
		}
	}
	return false
}

func (r *loadRun) result() VariantResult {
	var v VariantResult
	var lastEnd time.Duration
	var measuredTook int64
	recs := make([]recorder, len(r.workers))
	for i := range r.workers {
		ws := &r.workers[i]
		v.Reservations += ws.counts[took]
		v.Refusals += ws.counts[refused]
		v.Errors += ws.counts[failed]
		v.Ops += ws.counts[took] + ws.counts[refused] + ws.counts[answered] + ws.counts[failed]
		v.MeasuredOps += ws.measured
		measuredTook += ws.measuredTook
		lastEnd = max(lastEnd, ws.lastEnd)
		recs[i] = ws.rec
		if v.FirstError == "" && ws.firstErr != nil {
			v.FirstError = ws.firstErr.Error()
		}
	}
	v.EndedBy = r.endedBy
	v.WarmupOps = v.Ops - v.MeasuredOps
	window := max(0, lastEnd-time.Duration(r.warmEnd.Load()))
	v.MeasuredSec = math.Round(window.Seconds()*1000) / 1000
	v.ReservationsPerSec = rate(measuredTook, window)
	v.OpsPerSec = rate(v.MeasuredOps, window)
	v.Latency = summarize(merge(recs))
	v.Sold = transfer.Units(v.Reservations)
	return v
}
