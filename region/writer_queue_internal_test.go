package region

// The writer's queue without a database: every submitted op is answered exactly once, by its
// batch or by the stop, however submits and close interleave (no caller waits forever).

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
)

// gateOp answers "ok" without SQL, after release is closed.
type gateOp struct{ release chan struct{} }

func (o gateOp) apply(context.Context, *batch) (any, error, error) {
	<-o.release
	return "ok", nil, nil
}

func newBareWriter(queue int) *writer {
	w := &writer{clock: clock.Real{}, max: 4, in: make(chan pending, queue), m: newMemState(),
		onCommit: func(*batch) {}, onFail: func(err error) (*memState, error) { return nil, err }}
	w.start()
	return w
}

// TestWriterAnswersEveryOpAcrossClose: many submitters race a close while the writer is busy
// with a batch. Each submit returns, with "ok" (its batch ran), NOT_LEADER (never applied) or
// OVERLOADED (the queue was full; never applied), and a submit after the close is refused at
// once.
func TestWriterAnswersEveryOpAcrossClose(t *testing.T) {
	for round := 0; round < 20; round++ {
		w := newBareWriter(8)
		release := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		answers := map[string]int{}
		for i := 0; i < 64; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := submit[any](context.Background(), w, gateOp{release})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && res == "ok":
					answers["ok"]++
				case errors.Is(err, ErrNotLeader):
					answers["not leader"]++
				case errors.Is(err, apierr.ErrOverloaded):
					answers["overloaded"]++
				default:
					answers[err.Error()]++
				}
			}()
		}
		time.Sleep(time.Millisecond)
		closed := make(chan struct{})
		go func() { w.close(); close(closed) }()
		time.Sleep(time.Millisecond)
		close(release)
		waitOrFail(t, &wg, "a submit never returned")
		<-closed
		if answers["ok"]+answers["not leader"]+answers["overloaded"] != 64 {
			t.Fatalf("round %d: answers %v", round, answers)
		}
		if _, err := submit[any](context.Background(), w, gateOp{release}); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("submit after close: %v", err)
		}
		w.close() // idempotent
	}
}

// TestWriterFullQueueAnswersAtOnce: with the writer busy and its queue full, a submit is
// answered OVERLOADED with a retry-after at once (it does not wait for room), its op never
// runs, and the queued ops still complete.
func TestWriterFullQueueAnswersAtOnce(t *testing.T) {
	w := newBareWriter(4)
	defer w.close()
	release := make(chan struct{})
	var wg sync.WaitGroup
	var ok atomic.Int64
	for range 1 + 4 { // one in the writer's batch (max 4 takes the rest too), then fill the queue
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := submit[any](context.Background(), w, gateOp{release}); err == nil && res == "ok" {
				ok.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(w.in) < cap(w.in) && time.Now().Before(deadline) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := submit[any](context.Background(), w, gateOp{release}); err == nil && res == "ok" {
				ok.Add(1)
			}
		}()
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	ran := make(chan struct{})
	_, err := submit[any](context.Background(), w, gateOp{ran})
	var over *apierr.OverloadedError
	if !errors.As(err, &over) || over.RetryAfter <= 0 {
		t.Fatalf("submit to a full queue: %v; want OVERLOADED with a retry-after", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("the full queue took %s to answer; want at once", took)
	}
	close(release)
	waitOrFail(t, &wg, "a queued submit never returned")
	if ok.Load() == 0 {
		t.Error("no queued op completed")
	}
}

// TestWriterCanceledCallerIsUnknownOutcome: a caller whose context ends while its op waits is
// told the outcome is unknown at once; the op still runs and its finish hook runs once.
func TestWriterCanceledCallerIsUnknownOutcome(t *testing.T) {
	w := newBareWriter(8)
	defer w.close()
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{}, 2)
	errc := make(chan error, 1)
	go func() {
		_, err := submitThen[any](ctx, w, gateOp{release}, func() { finished <- struct{}{} })
		errc <- err
	}()
	time.Sleep(5 * time.Millisecond)
	cancel()
	if err := <-errc; !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("canceled caller got %v", err)
	}
	select {
	case <-finished:
		t.Fatal("finished ran before the op was done")
	case <-time.After(5 * time.Millisecond):
	}
	close(release)
	<-finished
	select {
	case <-finished:
		t.Fatal("finished ran twice")
	case <-time.After(5 * time.Millisecond):
	}
}

func waitOrFail(t *testing.T, wg *sync.WaitGroup, msg string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
}

// BenchmarkWriterSubmit measures the queue's own cost per op: callers submit ops that need no
// SQL, so what is timed is the hand-off to the writer, the batching and the answer.
func BenchmarkWriterSubmit(b *testing.B) {
	for _, callers := range []int{64, 2048} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			w := newBareWriter(4 * 256)
			w.max = 256
			defer w.close()
			done := make(chan struct{})
			close(done)
			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := submit[any](context.Background(), w, gateOp{done}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// countOp counts its applications.
type countOp struct{ n *atomic.Int64 }

func (o countOp) apply(context.Context, *batch) (any, error, error) {
	o.n.Add(1)
	return "ok", nil, nil
}

// TestWriterIgnoresAGoneCaller: a caller whose context has already ended gets the context's
// error, and its op is never applied (a reserve must not hold stock for nobody).
func TestWriterIgnoresAGoneCaller(t *testing.T) {
	w := newBareWriter(8)
	defer w.close()
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := submit[any](ctx, w, countOp{&n}); !errors.Is(err, context.Canceled) {
		t.Fatalf("submit with an ended context: %v", err)
	}
	if res, err := submit[any](context.Background(), w, countOp{&n}); err != nil || res != "ok" {
		t.Fatalf("next submit: %v, %v", res, err)
	}
	if n.Load() != 1 {
		t.Fatalf("applied %d ops; want only the live caller's", n.Load())
	}
}
