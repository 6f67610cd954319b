package linearize

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Recorder collects a history from concurrent clients: Begin at the call, End at the return.
// It is safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	start time.Time
	ops   []*Op
}

// Op is one recorded operation, open until End.
type Op struct {
	r      *Recorder
	client int
	in     Input
	call   int64
	ret    int64
	out    Output
	done   bool
}

// NewRecorder starts a history; times are measured from now on the monotonic clock.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// Begin records the call of in by client (a small number: porcupine's visualization draws one
// line per client).
func (r *Recorder) Begin(client int, in Input) *Op {
	op := &Op{r: r, client: client, in: in}
	r.mu.Lock()
	op.call = r.now()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
	return op
}

// End records the answer. An Unknown result leaves the operation open: it may take effect at
// any time after its call, so it is placed as returning after every other operation.
func (op *Op) End(out Output) {
	op.r.mu.Lock()
	defer op.r.mu.Unlock()
	if op.done {
		return
	}
	op.ret, op.out, op.done = op.r.now(), out, true
}

// Stats counts the recorded operations: all of them, and those whose outcome is unknown
// (never ended, or ended Unknown).
func (r *Recorder) Stats() (ops, unknown int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range r.ops {
		if !op.done || op.out.Result == Unknown {
			unknown++
		}
	}
	return len(r.ops), unknown
}

// History is the porcupine history so far; open operations return after every other one.
func (r *Recorder) History() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := make([]porcupine.Operation, 0, len(r.ops))
	open := int64(math.MaxInt64 / 2)
	for _, op := range r.ops {
		o := porcupine.Operation{ClientId: op.client, Input: op.in, Call: op.call, Output: op.out, Return: op.ret}
		if !op.done || op.out.Result == Unknown {
			o.Output, o.Return = Output{Result: Unknown}, open
			open++
		}
		h = append(h, o)
	}
	return h
}

// Check checks history against pool within timeout. It returns porcupine's result (Ok,
// Illegal, or Unknown when the timeout ran out) and the information for a visualization.
func Check(pool Pool, history []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	return porcupine.CheckOperationsVerbose(pool.Model(), history, timeout)
}

// Visualize writes porcupine's HTML visualization of a checked history to path.
func Visualize(pool Pool, info porcupine.LinearizationInfo, path string) error {
	if err := porcupine.VisualizePath(pool.Model(), info, path); err != nil {
		return fmt.Errorf("visualize %s: %w", path, err)
	}
	return nil
}
