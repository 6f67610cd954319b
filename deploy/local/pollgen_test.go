package local_test

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pollWorkers is how many polls the generator has in flight at most.
const pollWorkers = 128

// pollGen is a load generator of queued buyers' polls: every buyer polls its admission at
// the pace its last answer asked (retry_after_ms, with a tenth of jitter), in the order their
// polls fall due, but never more than rate polls a second in all. What two cores can send is
// far below what 200,000 buyers ask (40,000 polls/s at the 5 s cap), so the generator holds
// its cap and serves the most overdue buyers first; asked says what the buyers would send.
type pollGen struct {
	sale   string
	ids    []string
	rate   float64
	mu     sync.Mutex
	every  []time.Duration // each buyer's asked interval; 0 once it is no longer queued
	asked  float64         // Σ 1/every of the queued buyers, polls a second
	polls  atomic.Int64    // answered polls (200 or 202)
	fails  atomic.Int64    // others: no answer, or another status (tried again a second later)
	queued dueHeap         // the buyers' next polls, earliest first (under mu)
}

// newPollGen is a generator for the buyers ids of sale, each first asked to poll every
// every[i] (their Enter's retry_after_ms), capped at rate polls a second in all.
func newPollGen(sale string, ids []string, every []time.Duration, rate float64) *pollGen {
	g := &pollGen{sale: sale, ids: ids, rate: rate, every: every}
	for _, e := range every {
		if e > 0 {
			g.asked += 1 / e.Seconds()
		}
	}
	return g
}

// askedRate is what the queued buyers ask for in all now, polls a second.
func (g *pollGen) askedRate() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.asked
}

// run polls at base (a storefront address) with hc until ctx ends: every queued buyer's first poll at
// a random point of its asked interval, so the polls spread; then each at its pace. It
// returns once every poll it sent has been answered or given up.
func (g *pollGen) run(ctx context.Context, hc *http.Client, base string) {
	now := time.Now()
	g.mu.Lock()
	g.queued = g.queued[:0]
	for i, e := range g.every {
		if e > 0 {
			g.queued = append(g.queued, due{at: now.Add(time.Duration(rand.N(int64(e)))), i: i})
		}
	}
	heap.Init(&g.queued)
	g.mu.Unlock()
	work := make(chan int, pollWorkers)
	var wg sync.WaitGroup
	for range pollWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				g.pollOne(ctx, hc, base, i)
			}
		}()
	}
	g.dispatch(ctx, work)
	close(work)
	wg.Wait()
}

// dispatch hands the buyers due to the workers, at most rate a second (a token bucket of
// 20 ms of the rate), until ctx ends.
func (g *pollGen) dispatch(ctx context.Context, work chan<- int) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	burst := max(g.rate/50, 1)
	tokens, last := 0.0, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			tokens = min(tokens+g.rate*now.Sub(last).Seconds(), burst)
			last = now
		}
		for tokens >= 1 {
			i, ok := g.next(time.Now())
			if !ok {
				break
			}
			select {
			case work <- i:
				tokens--
			case <-ctx.Done():
				return
			}
		}
	}
}

// next pops the buyer whose poll is due first, if one is due by now.
func (g *pollGen) next(now time.Time) (int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queued) == 0 || g.queued[0].at.After(now) {
		return 0, false
	}
	return heap.Pop(&g.queued).(due).i, true
}

// pollOne polls buyer i once and schedules its next poll: at its retry_after_ms while it is
// queued, a second later after a failure, never once it is admitted or gone.
func (g *pollGen) pollOne(ctx context.Context, hc *http.Client, base string, i int) {
	a, err := edgeDo(ctx, hc, "GET", base+"/v1/sales/"+g.sale+"/admissions/"+g.ids[i], nil)
	if ctx.Err() != nil {
		return
	}
	wait := time.Second
	if err != nil || (a.code != http.StatusAccepted && a.code != http.StatusOK) {
		g.fails.Add(1)
	} else {
		g.polls.Add(1)
		ms, _ := a.body["retry_after_ms"].(float64)
		if a.str("state") != "queued" || ms <= 0 {
			g.setEvery(i, 0) // admitted (one a second) or gone: this buyer stops polling
			return
		}
		g.setEvery(i, time.Duration(ms)*time.Millisecond)
		wait = time.Duration(ms)*time.Millisecond + time.Duration(rand.N(int64(ms)/10+1))*time.Millisecond
	}
	g.mu.Lock()
	heap.Push(&g.queued, due{at: time.Now().Add(wait), i: i})
	g.mu.Unlock()
}

// setEvery records buyer i's asked interval (0: it no longer polls) in the asked pace.
func (g *pollGen) setEvery(i int, e time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old := g.every[i]; old > 0 {
		g.asked -= 1 / old.Seconds()
	}
	if e > 0 {
		g.asked += 1 / e.Seconds()
	}
	g.every[i] = e
}

// due is a buyer's next poll.
type due struct {
	at time.Time
	i  int
}

// dueHeap orders the buyers' next polls, earliest first (container/heap).
type dueHeap []due

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(a, b int) bool { return h[a].at.Before(h[b].at) }
func (h dueHeap) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(due)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// TestPollGenHoldsThePaceUnderTheCap: the generator sends each buyer's polls at the pace the
// answers ask while that is under its cap, holds the cap when the buyers ask for more (and
// says what they asked), and stops polling a buyer once admitted. Against an HTTP server in
// the test, with no cluster.
func TestPollGenHoldsThePaceUnderTheCap(t *testing.T) {
	var served sync.Map // admission id → *atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		n, _ := served.LoadOrStore(id, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		w.Header().Set("Content-Type", "application/json")
		if id == "admitted" {
			fmt.Fprint(w, `{"state":"admitted","ticket":"v1.t"}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, `{"state":"queued","retry_after_ms":250}`)
	}))
	defer srv.Close()
	buyers := func(n int) ([]string, []time.Duration) {
		ids, every := []string{"admitted"}, []time.Duration{250 * time.Millisecond}
		for i := range n - 1 {
			ids, every = append(ids, "b"+strconv.Itoa(i)), append(every, 250*time.Millisecond)
		}
		return ids, every
	}
	for _, tc := range []struct {
		name     string
		n        int
		rate     float64
		min, max int64 // polls in 2 s
	}{
		{"under the cap: the buyers' pace", 50, 10_000, 300, 440}, // 200/s asked, 400 in 2 s
		{"over the cap: the cap", 400, 300, 420, 640},             // 1,600/s asked, 300/s sent
	} {
		served.Clear()
		ids, every := buyers(tc.n)
		g := newPollGen("s", ids, every, tc.rate)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		g.run(ctx, srv.Client(), srv.URL)
		cancel()
		if p := g.polls.Load(); p < tc.min || p > tc.max || g.fails.Load() != 0 {
			t.Errorf("%s: %d polls (%d failed) in 2 s, want %d..%d", tc.name, p, g.fails.Load(), tc.min, tc.max)
		}
		if n, _ := served.Load("admitted"); n.(*atomic.Int64).Load() != 1 {
			t.Errorf("%s: the admitted buyer polled %d times, want once", tc.name, n.(*atomic.Int64).Load())
		}
		if want, got := float64(tc.n-1)*4, g.askedRate(); got < want-0.01 || got > want+0.01 {
			t.Errorf("%s: asked %.2f polls/s, want %.0f (4/s for each queued buyer)", tc.name, got, want)
		}
	}
}
