package linearize

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// op builds a history entry: client, call and return times, input and output.
func op(client int, call, ret int64, in Input, out Output) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
}

func res(user, key string) Input { return Input{Kind: Reserve, User: user, Key: key, Qty: 1} }
func conf(h string) Input        { return Input{Kind: Confirm, Hold: h, Payment: "p-" + h} }
func rel(h string) Input         { return Input{Kind: Release, Hold: h} }
func held(h string) Output       { return Output{Result: Held, Hold: h} }
func out(r Result) Output        { return Output{Result: r} }

const forever = int64(1 << 60)

func TestCheck(t *testing.T) {
	one := Pool{Units: 1}
	cases := []struct {
		name string
		pool Pool
		h    []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"concurrent reserves of the last unit, one wins", one, []porcupine.Operation{
			op(0, 0, 10, res("a", "k"), held("h1")),
			op(1, 1, 9, res("b", "k"), out(Empty)),
			op(0, 11, 12, conf("h1"), out(Sold)),
		}, porcupine.Ok},
		{"two successful reserves of the last unit", one, []porcupine.Operation{
			op(0, 0, 10, res("a", "k"), held("h1")),
			op(1, 1, 9, res("b", "k"), held("h2")),
		}, porcupine.Illegal},
		{"a confirm that sells after a release", one, []porcupine.Operation{
			op(0, 0, 1, res("a", "k"), held("h1")),
			op(0, 2, 3, rel("h1"), out(Released)),
			op(0, 4, 5, conf("h1"), out(Sold)),
		}, porcupine.Illegal},
		{"a confirm concurrent with the release may win", one, []porcupine.Operation{
			op(0, 0, 1, res("a", "k"), held("h1")),
			op(0, 2, 6, rel("h1"), out(Conflict)),
			op(1, 3, 5, conf("h1"), out(Sold)),
		}, porcupine.Ok},
		{"a release gives the unit back", one, []porcupine.Operation{
			op(0, 0, 1, res("a", "k"), held("h1")),
			op(0, 2, 3, rel("h1"), out(Released)),
			op(1, 4, 5, res("b", "k"), held("h2")),
			op(0, 6, 7, conf("h1"), out(Refund)),
		}, porcupine.Ok},
		{"sold out while the unit is free", one, []porcupine.Operation{
			op(0, 0, 1, res("a", "k"), out(Empty)),
		}, porcupine.Illegal},
		{"an unknown reserve may have taken the last unit", one, []porcupine.Operation{
			op(0, 0, forever, res("a", "k"), out(Unknown)),
			op(1, 5, 6, res("b", "k"), out(Empty)),
		}, porcupine.Ok},
		{"an unknown reserve may not have taken it", one, []porcupine.Operation{
			op(0, 0, forever, res("a", "k"), out(Unknown)),
			op(1, 5, 6, res("b", "k"), held("h2")),
		}, porcupine.Ok},
		{"the retry of an unknown reserve names its hold, no second unit", Pool{Units: 2}, []porcupine.Operation{
			op(0, 0, forever, res("a", "k"), out(Unknown)),
			op(1, 5, 6, res("b", "k"), held("h2")),
			op(0, 7, 8, res("a", "k"), held("h1")),
			op(1, 9, 10, res("c", "k"), out(Empty)),
		}, porcupine.Ok},
		{"an acknowledged hold the region no longer knows", one, []porcupine.Operation{
			op(0, 0, 1, res("a", "k"), held("h1")),
			op(0, 2, 3, conf("h1"), out(NotFound)),
		}, porcupine.Illegal},
		{"a refund for a live hold", one, []porcupine.Operation{
			op(0, 0, 1, res("a", "k"), held("h1")),
			op(0, 2, 3, conf("h1"), out(Refund)),
		}, porcupine.Illegal},
		{"a limit answer for a user under the limit", Pool{Units: 5, Limit: 1}, []porcupine.Operation{
			op(0, 0, 1, res("a", "k1"), held("h1")),
			op(0, 2, 3, res("a", "k2"), out(Limit)),
			op(1, 4, 5, res("b", "k1"), out(Limit)),
		}, porcupine.Illegal},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, info := Check(c.pool, c.h, 10*time.Second)
			if got != c.want {
				path := filepath.Join(t.TempDir(), "history.html")
				if err := Visualize(c.pool, info, path); err != nil {
					t.Log(err)
				}
				t.Fatalf("check: %v, want %v (visualization %s)", got, c.want, path)
			}
		})
	}
}

// TestRecorderConcurrent records a correct concurrent history from a mutex-guarded pool and
// then the same history with one answer falsified.
func TestRecorderConcurrent(t *testing.T) {
	pool := Pool{Units: 20}
	rec := NewRecorder()
	var (
		mu    sync.Mutex
		avail = pool.Units
		holds = map[string]string{} // id → held|sold|released
		wg    sync.WaitGroup
	)
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				id := fmt.Sprintf("h-%d-%d", c, i)
				o := rec.Begin(c, res(fmt.Sprint("u", c), fmt.Sprint("k", i)))
				mu.Lock()
				got := avail > 0
				if got {
					avail--
					holds[id] = "held"
				}
				mu.Unlock()
				if !got {
					o.End(out(Empty))
					continue
				}
				o.End(held(id))
				if i%3 == 0 {
					o = rec.Begin(c, conf(id))
					mu.Lock()
					holds[id] = "sold"
					mu.Unlock()
					o.End(out(Sold))
					continue
				}
				o = rec.Begin(c, rel(id))
				mu.Lock()
				holds[id] = "released"
				avail++
				mu.Unlock()
				o.End(out(Released))
			}
		}()
	}
	wg.Wait()
	h := rec.History()
	if got, _ := Check(pool, h, 30*time.Second); got != porcupine.Ok {
		t.Fatalf("a correct history: %v, want ok", got)
	}
	n, unknown := rec.Stats()
	if n != len(h) || unknown != 0 {
		t.Fatalf("stats %d ops, %d unknown; want %d, 0", n, unknown, len(h))
	}
	// Falsify one answer: the first confirm, which sold a live hold, is told to refund.
	bad := append([]porcupine.Operation(nil), h...)
	for i, o := range bad {
		if o.Input.(Input).Kind == Confirm {
			bad[i].Output = out(Refund) // a live hold refunded
			break
		}
	}
	if got, _ := Check(pool, bad, 30*time.Second); got != porcupine.Illegal {
		t.Fatalf("a falsified history: %v, want illegal", got)
	}
}

// TestRecorderOpen: an operation never ended (its outcome unknown) may take effect after every
// later one, so a later sold-out answer is explained by it; without it, it is not.
func TestRecorderOpen(t *testing.T) {
	pool := Pool{Units: 1}
	rec := NewRecorder()
	rec.Begin(0, res("a", "k")) // the answer was lost
	o := rec.Begin(1, res("b", "k"))
	o.End(out(Empty))
	if got, _ := Check(pool, rec.History(), 10*time.Second); got != porcupine.Ok {
		t.Fatalf("with an open reserve: %v, want ok", got)
	}
	if _, unknown := rec.Stats(); unknown != 1 {
		t.Fatalf("unknown %d, want 1", unknown)
	}
	h := rec.History()[1:]
	if got, _ := Check(pool, h, 10*time.Second); got != porcupine.Illegal {
		t.Fatalf("without it: %v, want illegal", got)
	}
}
