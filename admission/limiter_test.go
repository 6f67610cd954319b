package admission

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var limiterStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestLimiterRate(t *testing.T) {
	l := NewLimiter(10, 5, 100)
	now := limiterStart
	for i := range 5 {
		if ok, _ := l.Allow("u", now); !ok {
			t.Fatalf("immediate request %d refused; want a burst of 5", i+1)
		}
	}
	ok, retry := l.Allow("u", now)
	if ok || retry != 100*time.Millisecond {
		t.Fatalf("6th immediate request = %v, %v; want refused, retry after 100ms", ok, retry)
	}
	// Over 10 simulated seconds, in 1ms steps, exactly one request a 100ms gets through.
	allowed := 0
	for step := 1; step <= 10000; step++ {
		now = limiterStart.Add(time.Duration(step) * time.Millisecond)
		ok, retry := l.Allow("u", now)
		if ok != (step%100 == 0) {
			t.Fatalf("at %dms: ok = %v", step, ok)
		}
		if !ok && retry != time.Duration(100-step%100)*time.Millisecond {
			t.Fatalf("at %dms: retry after %v", step, retry)
		}
		if ok {
			allowed++
		}
	}
	if allowed != 100 {
		t.Errorf("allowed %d in 10s at rate 10, want 100", allowed)
	}
}

func TestLimiterRefillsToBurstOnly(t *testing.T) {
	l := NewLimiter(10, 5, 100)
	l.Allow("u", limiterStart)
	later := limiterStart.Add(time.Hour) // an hour idle earns no more than burst
	for i := range 6 {
		ok, _ := l.Allow("u", later)
		if ok != (i < 5) {
			t.Fatalf("request %d after an hour idle: ok = %v", i+1, ok)
		}
	}
}

func TestLimiterRetryAfterIsExact(t *testing.T) {
	l := NewLimiter(3, 2, 10) // an interval of 333.333333ms
	l.Allow("u", limiterStart)
	l.Allow("u", limiterStart)
	now := limiterStart.Add(50 * time.Millisecond)
	ok, retry := l.Allow("u", now)
	if ok || retry <= 0 {
		t.Fatalf("Allow = %v, %v; want refused with a retry-after", ok, retry)
	}
	if ok, _ := l.Allow("u", now.Add(retry-1)); ok {
		t.Error("allowed a nanosecond before retry-after")
	}
	if ok, _ := l.Allow("u", now.Add(retry)); !ok {
		t.Error("refused at retry-after")
	}
}

func TestLimiterKeysAreIndependent(t *testing.T) {
	l := NewLimiter(1, 1, 10)
	if ok, _ := l.Allow("a", limiterStart); !ok {
		t.Fatal("a refused")
	}
	if ok, _ := l.Allow("a", limiterStart); ok {
		t.Fatal("a allowed twice with a burst of 1")
	}
	if ok, _ := l.Allow("b", limiterStart); !ok {
		t.Fatal("b refused because of a")
	}
}

func TestLimiterBoundsKeys(t *testing.T) {
	l := NewLimiter(1, 2, 3) // a bucket refills a second after its last use
	for _, k := range []string{"a", "b", "c"} {
		l.Allow(k, limiterStart)
	}
	l.Allow("a", limiterStart) // a is empty, refilled at +2s; b and c at +1s
	ok, retry := l.Allow("d", limiterStart.Add(100*time.Millisecond))
	if ok || retry != 900*time.Millisecond {
		t.Fatalf("new key on a full table = %v, %v; want refused, retry after 900ms", ok, retry)
	}
	if l.Len() != 3 {
		t.Fatalf("Len = %d, want 3", l.Len())
	}
	// Refused new keys keep the others' state: a is still empty.
	for i := range 100 {
		l.Allow(fmt.Sprint("flood", i), limiterStart.Add(200*time.Millisecond))
	}
	if ok, _ := l.Allow("a", limiterStart.Add(300*time.Millisecond)); ok {
		t.Error("a's bucket was reset by the flood")
	}
	// At +1s b and c are full again and are dropped; d and e take their places.
	at := limiterStart.Add(time.Second)
	for _, k := range []string{"d", "e"} {
		if ok, _ := l.Allow(k, at); !ok {
			t.Fatalf("%s refused after b and c refilled", k)
		}
	}
	ok, retry = l.Allow("f", at) // a, d and e are all full again at +2s
	if ok || retry != time.Second {
		t.Fatalf("f = %v, %v; want refused, retry after 1s", ok, retry)
	}
	if l.Len() != 3 {
		t.Fatalf("Len = %d, want 3", l.Len())
	}
}

// TestLimiterModel drives many keys through a small table at random times and checks the
// bound (never more than maxKeys buckets) and the rate (no key gets more than burst +
// rate × span requests in any span, evictions included).
func TestLimiterModel(t *testing.T) {
	const (
		rate    = 20 // a request every 50ms
		burst   = 4
		maxKeys = 8
	)
	interval := time.Second / rate
	r := rand.New(rand.NewPCG(1, 2))
	l := NewLimiter(rate, burst, maxKeys)
	allowed := map[string][]time.Time{}
	now := limiterStart
	refusedNew := 0
	for range 20000 {
		now = now.Add(time.Duration(r.IntN(int(3 * time.Millisecond))))
		key := fmt.Sprint("k", r.IntN(20))
		_, known := l.full[key]
		ok, retry := l.Allow(key, now)
		if ok {
			allowed[key] = append(allowed[key], now)
		} else if retry <= 0 {
			t.Fatalf("refused with retry-after %v", retry)
		}
		if n := l.Len(); n > maxKeys {
			t.Fatalf("Len = %d, over maxKeys %d", n, maxKeys)
		}
		if !ok && !known {
			refusedNew++
		}
	}
	for key, times := range allowed {
		for i := range times {
			for j := i; j < len(times); j++ {
				limit := burst + int(times[j].Sub(times[i])/interval)
				if j-i+1 > limit {
					t.Fatalf("%s: %d requests in %v, over %d", key, j-i+1, times[j].Sub(times[i]), limit)
				}
			}
		}
	}
	if refusedNew == 0 {
		t.Error("no new key was refused: the table never filled, so the bound went untested")
	}
}

func TestLimiterConcurrent(t *testing.T) {
	l := NewLimiter(1, 5, 1000)
	var got atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 200 {
				if ok, _ := l.Allow(fmt.Sprint("k", i%50), limiterStart); ok {
					got.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got.Load() != 50*5 {
		t.Errorf("allowed %d, want 50 keys × burst 5 = 250", got.Load())
	}
}

func TestLimiterExtremeRates(t *testing.T) {
	slow := NewLimiter(1e-300, 3, 1)
	for i := range 4 {
		ok, retry := slow.Allow("u", limiterStart)
		if ok != (i < 3) || (!ok && retry <= 0) {
			t.Fatalf("slow request %d = %v, %v", i+1, ok, retry)
		}
	}
	fast := NewLimiter(1e12, 1, 1)
	for i := range 3 {
		if ok, _ := fast.Allow("u", limiterStart.Add(time.Duration(i))); !ok {
			t.Fatalf("fast request %d refused", i+1)
		}
	}
}

func TestNewLimiterPanicsOnBadConfig(t *testing.T) {
	for _, c := range []struct {
		rate           float64
		burst, maxKeys int
	}{{0, 1, 1}, {-1, 1, 1}, {math.NaN(), 1, 1}, {math.Inf(1), 1, 1}, {1, 0, 1}, {1, 1, 0}, {1, maxBurst + 1, 1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewLimiter(%v, %d, %d) did not panic", c.rate, c.burst, c.maxKeys)
				}
			}()
			NewLimiter(c.rate, c.burst, c.maxKeys)
		}()
	}
}
