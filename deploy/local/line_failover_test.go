package local_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
)

// lineBuyers is how many buyers TestLocalLineSurvivesKill9 queues: QUOTA_LINE_BUYERS, default
// 3,000 (about a minute and a half here); the figure of a national sale's test is 50,000.
func lineBuyers(t *testing.T) int {
	n := 3000
	if v := os.Getenv("QUOTA_LINE_BUYERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 200 || n > 200_000 {
			t.Fatalf("QUOTA_LINE_BUYERS=%q: want 200..200000", v)
		}
	}
	return n
}

// linePlace is one buyer's admission as polled.
type linePlace struct {
	user, id, state, ticket, expires string
	position                         int
}

// TestLocalLineSurvivesKill9: kill -9 of us's leader (region-us) while its waiting room holds
// thousands of queued buyers, max_live_tickets admitted (some of whose tickets were used).
// After region-us-2 takes over, at its edge: every admission id is known (never 404), every
// queued buyer is at the same position or a better one and behind no one who was behind
// them, every admitted buyer is still admitted with the same ticket, which reserves, every
// used admission is still used, and the live tickets never exceed max_live_tickets while the
// new leader admits more.
func TestLocalLineSurvivesKill9(t *testing.T) {
	const (
		ttl     = 2 * time.Second
		sale    = "line"
		maxLive = 100
		used    = 30
		workers = 16
	)
	buyers := lineBuyers(t)
	started := time.Now()
	c := newLocalCluster(t, "lf", "QUOTA_CLUSTER_LEASE_TTL="+ttl.String())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c.cluster(5*time.Minute, "up")
	coord := c.addr(0)
	if out, err := c.quotactl(coord, "sale", "create", "--sale", sale, "--sku", "phone=100000", "--per-user-limit", "1",
		"--hold-ttl", "10m", "--admit-rate", "1000", "--ticket-ttl", "10m", "--max-live-tickets", strconv.Itoa(maxLive),
		"--allocate", "us=1,eu=1,ap=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	var leader string
	c.eventually(10*time.Second, "the coordinator lists us's leader", func() error {
		if leader = currentRegionAddr(ctx, c.creds(trust.Operator), coord, "us"); leader != c.addr(1) {
			return fmt.Errorf("us's leader at %q, want region-us", leader)
		}
		return nil
	})
	atA, atB := edgeOf(t, c.addr(1)), edgeOf(t, c.addr(11))
	hc := c.edgeClient("10.3", 10*time.Second)
	admissions := func(base string) string { return base + "/v1/sales/" + sale + "/admissions" }

	// Enter every buyer at the leader, 16 at a time, in the order of their numbers.
	enterStart := time.Now()
	places := make([]linePlace, buyers)
	forAll(t, buyers, workers, func(i int) error {
		user := fmt.Sprintf("buyer-%06d", i)
		a, err := edgeDo(ctx, hc, "POST", admissions(atA), map[string]string{"user_id": user})
		if err != nil || a.code != http.StatusAccepted || a.str("admission_id") == "" {
			return fmt.Errorf("%s entering: %d %v %v", user, a.code, a.body, err)
		}
		places[i] = linePlace{user: user, id: a.str("admission_id")}
		return nil
	})
	t.Logf("%d buyers entered at region-us in %s", buyers, time.Since(enterStart).Round(time.Millisecond))
	snapshot := func(base string) []linePlace {
		out := make([]linePlace, buyers)
		forAll(t, buyers, workers, func(i int) error {
			p, err := pollPlace(ctx, hc, admissions(base), places[i])
			out[i] = p
			return err
		})
		return out
	}
	liveOf := func(ps []linePlace) (live, queued int) {
		for _, p := range ps {
			switch p.state {
			case "admitted":
				live++
			case "queued":
				queued++
			}
		}
		return live, queued
	}
	// Wait for the cap to fill, use some tickets, and wait for the cap to fill again.
	var before []linePlace
	c.eventually(30*time.Second, "max_live_tickets admitted", func() error {
		before = snapshot(atA)
		if live, _ := liveOf(before); live != maxLive {
			return fmt.Errorf("%d live", live)
		}
		return nil
	})
	n := 0
	for i := range before {
		if before[i].state == "admitted" && n < used {
			reserveWith(ctx, t, hc, atA, sale, before[i], http.StatusCreated)
			n++
		}
	}
	c.eventually(30*time.Second, "the used places refilled", func() error {
		before = snapshot(atA)
		if live, _ := liveOf(before); live != maxLive {
			return fmt.Errorf("%d live", live)
		}
		return nil
	})
	live, queued := liveOf(before)
	t.Logf("before the kill: %d live, %d queued, %d used", live, queued, used)

	killed := time.Now()
	c.cluster(30*time.Second, "kill", "region-us")
	c.eventually(20*time.Second, "region-us-2 answers polls", func() error {
		_, err := pollPlace(ctx, hc, admissions(atB), places[0])
		return err
	})
	t.Logf("region-us-2 answered a poll %s after kill -9", time.Since(killed).Round(time.Millisecond))
	after := snapshot(atB)
	checkPlaces(t, before, after, maxLive)
	// Every ticket out before the kill reserves at the new leader, and the cap holds while
	// the new leader admits the next buyers.
	for i := range before {
		if before[i].state == "admitted" {
			reserveWith(ctx, t, hc, atB, sale, before[i], http.StatusCreated)
		}
	}
	c.eventually(30*time.Second, "the new leader admits the next buyers", func() error {
		next := snapshot(atB)
		if live, _ := liveOf(next); live > maxLive {
			t.Fatalf("%d live tickets after the takeover, over max_live_tickets %d", live, maxLive)
		} else if live < maxLive {
			return fmt.Errorf("%d live", live)
		}
		return nil
	})
	if out, err := c.quotactl(coord, "audit", "--sale", sale); err != nil {
		t.Fatalf("audit of sale %s: %v\n%s", sale, err, out)
	}
	t.Logf("LINE: %d buyers (%d queued, %d live) kept across kill -9 of region-us; test %s", buyers, queued, live,
		time.Since(started).Round(time.Second))
}

// checkPlaces compares every buyer's place before and after the takeover.
func checkPlaces(t *testing.T, before, after []linePlace, maxLive int) {
	t.Helper()
	bad := 0
	fail := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	var queued []int
	live := 0
	for i, b := range before {
		a := after[i]
		switch b.state {
		case "queued":
			if a.state != "queued" || a.position < 1 || a.position > b.position {
				fail("%s: queued at %d, then %s at %d", b.user, b.position, a.state, a.position)
			}
			queued = append(queued, i)
		case "admitted":
			if a.state != "admitted" || a.ticket != b.ticket || a.expires != b.expires {
				fail("%s: admitted until %s, then %s until %s (same ticket: %v)", b.user, b.expires, a.state, a.expires, a.ticket == b.ticket)
			}
		case "used":
			if a.state != "used" {
				fail("%s: used, then %s", b.user, a.state)
			}
		}
		if a.state == "admitted" {
			live++
		}
	}
	sort.Slice(queued, func(x, y int) bool { return before[queued[x]].position < before[queued[y]].position })
	for k := 1; k < len(queued); k++ {
		if p, q := after[queued[k-1]], after[queued[k]]; p.position >= q.position {
			fail("%s was ahead of %s, then at %d, not ahead of %d", p.user, q.user, p.position, q.position)
		}
	}
	if live > maxLive {
		t.Errorf("%d live tickets after the takeover, over max_live_tickets %d", live, maxLive)
	}
	if bad > 0 {
		t.Fatalf("%d buyers lost their place", bad)
	}
}

// pollPlace polls one admission: 202 queued, or 200 admitted or used; anything else (404,
// 503 while no one leads) is an error.
func pollPlace(ctx context.Context, hc *http.Client, base string, p linePlace) (linePlace, error) {
	a, err := edgeDo(ctx, hc, "GET", base+"/"+p.id, nil)
	if err != nil {
		return p, err
	}
	if a.code != http.StatusAccepted && a.code != http.StatusOK {
		return p, fmt.Errorf("%s's admission %s: %d %v", p.user, p.id, a.code, a.body)
	}
	p.state, p.ticket, p.expires = a.str("state"), a.str("ticket"), a.str("expires_at")
	if pos, ok := a.body["position"].(float64); ok {
		p.position = int(pos)
	} else {
		p.position = 0
	}
	return p, nil
}

// reserveWith reserves one unit with p's ticket and wants code.
func reserveWith(ctx context.Context, t *testing.T, hc *http.Client, base, sale string, p linePlace, code int) {
	t.Helper()
	r := edgeCall(ctx, t, hc, "POST", base+"/v1/sales/"+sale+"/reservations",
		map[string]any{"ticket": p.ticket, "sku": "phone", "quantity": 1, "request_key": "k-" + p.user})
	if r.code != code || (code == http.StatusCreated && r.str("admission_id") != p.id) {
		t.Fatalf("%s reserving at %s: %d %v, want %d", p.user, base, r.code, r.body, code)
	}
}

// forAll runs f(0..n-1) on workers goroutines and fails the test with the first error.
func forAll(t *testing.T, n, workers int, f func(i int) error) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					first = errors.Join(first, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		msg := first.Error()
		if lines := strings.Split(msg, "\n"); len(lines) > 10 {
			msg = strings.Join(lines[:10], "\n") + fmt.Sprintf("\n... %d more", len(lines)-10)
		}
		t.Fatal(msg)
	}
}
