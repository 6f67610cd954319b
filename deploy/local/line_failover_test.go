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

// The line failover's sale: a room that admits 1,000 buyers a second up to lineMaxLive live
// tickets, of phones (plenty) and cases (three, one a region, all held before the kill: the
// SKU whose waitlist the test fills).
const (
	lineSale    = "line"
	lineMaxLive = 100
	lineUsed    = 30
	lineWorkers = 16
)

// lineTest is TestLocalLineSurvivesKill9's cluster and what it has seen.
type lineTest struct {
	t        *testing.T
	c        *localCluster
	ctx      context.Context
	hc       *http.Client
	within   time.Duration // how long a round over every buyer may take (scaled by the buyers)
	atA, atB string        // region-us's and region-us-2's storefront listeners
	places   []linePlace   // the room's buyers, in the order they entered
	listed   []linePlace   // the waitlist's buyers, in the order of their turns
	caseHold string        // us's case hold, released before the kill for an offer
}

// TestLocalLineSurvivesKill9: kill -9 of us's leader (region-us) while its waiting room holds
// thousands of queued buyers, max_live_tickets admitted (some of whose tickets were used), and
// a sold-out SKU's waitlist holds a tenth as many buyers, the first with an offer out. After
// region-us-2 takes over, at its edge: every admission id is known (never 404), every queued
// buyer is at the same position or a better one and behind no one who was behind them, in
// the room and on the waitlist alike, every admitted buyer is still admitted with the same
// ticket, which reserves, the waitlist's offer too, every used admission is still used, and
// the live tickets never exceed max_live_tickets while the new leader admits more.
func TestLocalLineSurvivesKill9(t *testing.T) {
	buyers := lineBuyers(t)
	started := time.Now()
	lt := startLine(t, buyers)
	c := lt.c
	lt.enter(buyers)
	lt.drainCase("eu", c.addr(2))
	lt.drainCase("ap", c.addr(3))
	lt.useTickets(lt.capFilled())
	lt.joinWaitlist(max(buyers/10, 20))
	lt.offerToTheFirst()
	before := lt.capFilled()
	listBefore := lt.snapshot(lt.atA, lt.listed)
	live, queued := liveOf(before)
	t.Logf("before the kill: %d live, %d queued, %d used; %d on the waitlist, the first with an offer", live, queued,
		lineUsed, len(lt.listed))

	killed := time.Now()
	c.cluster(30*time.Second, "kill", "region-us")
	c.eventually(20*time.Second, "region-us-2 answers polls", func() error {
		_, err := pollPlace(lt.ctx, lt.hc, admissionsAt(lt.atB), lt.places[0])
		return err
	})
	t.Logf("region-us-2 answered a poll %s after kill -9", time.Since(killed).Round(time.Millisecond))
	checkPlaces(t, "the room", before, lt.snapshot(lt.atB, lt.places), lineMaxLive)
	checkPlaces(t, "the waitlist", listBefore, lt.snapshot(lt.atB, lt.listed), 1)
	lt.afterTakeover(before, listBefore)
	if out, err := c.quotactl(c.addr(0), "audit", "--sale", lineSale); err != nil {
		t.Fatalf("audit of sale %s: %v\n%s", lineSale, err, out)
	}
	t.Logf("LINE: %d buyers (%d queued, %d live) and %d waitlisted kept across kill -9 of region-us; test %s", buyers, queued,
		live, len(lt.listed), time.Since(started).Round(time.Second))
}

// startLine brings the cluster up with a 2 s lease and creates the sale, region-us leading.
func startLine(t *testing.T, buyers int) *lineTest {
	const ttl = 2 * time.Second
	c := newLocalCluster(t, "lf", "QUOTA_CLUSTER_LEASE_TTL="+ttl.String())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute+time.Duration(buyers)*8*time.Millisecond)
	t.Cleanup(cancel)
	c.cluster(5*time.Minute, "up")
	coord := c.addr(0)
	// Manual rebalancing: the cases stay where they were allocated, one a region, until held.
	if out, err := c.quotactl(coord, "sale", "create", "--sale", lineSale, "--sku", "phone=100000", "--sku", "case=3",
		"--per-user-limit", "1", "--hold-ttl", "30m", "--admit-rate", "1000", "--ticket-ttl", "30m", "--max-live-tickets",
		strconv.Itoa(lineMaxLive), "--rebalance", "manual", "--allocate", "us=1,eu=1,ap=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	c.eventually(10*time.Second, "the coordinator lists us's leader", func() error {
		if leader := currentRegionAddr(ctx, c.creds(trust.Operator), coord, "us"); leader != c.addr(1) {
			return fmt.Errorf("us's leader at %q, want region-us", leader)
		}
		return nil
	})
	return &lineTest{t: t, c: c, ctx: ctx, hc: c.edgeClient("10.3", 10*time.Second), atA: edgeOf(t, c.addr(1)),
		atB: edgeOf(t, c.addr(11)), within: 30*time.Second + time.Duration(buyers)*2*time.Millisecond}
}

// admissionsAt is the sale's admissions at a storefront listener.
func admissionsAt(base string) string { return base + "/v1/sales/" + lineSale + "/admissions" }

// enter enters every buyer at the leader, 16 at a time, in the order of their numbers.
func (lt *lineTest) enter(buyers int) {
	start := time.Now()
	lt.places = make([]linePlace, buyers)
	forAll(lt.t, buyers, lineWorkers, func(i int) error {
		user := fmt.Sprintf("buyer-%06d", i)
		a, err := edgeDo(lt.ctx, lt.hc, "POST", admissionsAt(lt.atA), map[string]string{"user_id": user})
		if err != nil || a.code != http.StatusAccepted || a.str("admission_id") == "" {
			return fmt.Errorf("%s entering: %d %v %v", user, a.code, a.body, err)
		}
		lt.places[i] = linePlace{user: user, id: a.str("admission_id")}
		return nil
	})
	lt.t.Logf("%d buyers entered at region-us in %s", buyers, time.Since(start).Round(time.Millisecond))
}

// snapshot polls every one of ps at base, 16 at a time.
func (lt *lineTest) snapshot(base string, ps []linePlace) []linePlace {
	out := make([]linePlace, len(ps))
	forAll(lt.t, len(ps), lineWorkers, func(i int) error {
		p, err := pollPlace(lt.ctx, lt.hc, admissionsAt(base), ps[i])
		out[i] = p
		return err
	})
	return out
}

// liveOf counts the admitted and the queued places of ps.
func liveOf(ps []linePlace) (live, queued int) {
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

// capFilled waits until max_live_tickets of the room's buyers are admitted and returns the
// room as polled then.
func (lt *lineTest) capFilled() []linePlace {
	var ps []linePlace
	lt.c.eventually(lt.within, "max_live_tickets admitted", func() error {
		ps = lt.snapshot(lt.atA, lt.places)
		if live, _ := liveOf(ps); live != lineMaxLive {
			return fmt.Errorf("%d live", live)
		}
		return nil
	})
	return ps
}

// useTickets reserves with lineUsed of the admitted buyers' tickets: the first takes us's
// case (the waitlist's SKU sells out), the others a phone each.
func (lt *lineTest) useTickets(ps []linePlace) {
	n := 0
	for _, p := range ps {
		if p.state != "admitted" || n == lineUsed {
			continue
		}
		if n == 0 {
			lt.caseHold = reserveWith(lt.ctx, lt.t, lt.hc, lt.atA, "case", p, http.StatusCreated).str("hold_id")
		} else {
			reserveWith(lt.ctx, lt.t, lt.hc, lt.atA, "phone", p, http.StatusCreated)
		}
		n++
	}
}

// drainCase holds region r's case (at the region process whose gRPC address is grpcAddr)
// with a buyer admitted there, so that once every region's is held the case is sold out.
func (lt *lineTest) drainCase(r, grpcAddr string) {
	base := edgeOf(lt.t, grpcAddr)
	a := edgeCall(lt.ctx, lt.t, lt.hc, "POST", admissionsAt(base), map[string]string{"user_id": "case-" + r})
	if a.code != http.StatusAccepted {
		lt.t.Fatalf("case-%s entering at %s: %d %v", r, r, a.code, a.body)
	}
	p := linePlace{user: "case-" + r, id: a.str("admission_id")}
	lt.c.eventually(20*time.Second, "case-"+r+" admitted", func() error {
		var err error
		if p, err = pollPlace(lt.ctx, lt.hc, admissionsAt(base), p); err == nil && p.state != "admitted" {
			err = fmt.Errorf("%s", p.state)
		}
		return err
	})
	reserveWith(lt.ctx, lt.t, lt.hc, base, "case", p, http.StatusCreated)
}

// joinWaitlist puts n buyers on the case's waitlist at region-us, 16 at a time, once the
// case is sold out everywhere; lt.listed is them in the order of the positions they were told.
func (lt *lineTest) joinWaitlist(n int) {
	join := func(user string) (linePlace, error) {
		a, err := edgeDo(lt.ctx, lt.hc, "POST", lt.atA+"/v1/sales/"+lineSale+"/waitlist", map[string]string{"user_id": user, "sku": "case"})
		pos, _ := a.body["position"].(float64)
		if err != nil || a.code != http.StatusAccepted || a.str("admission_id") == "" || pos < 1 {
			return linePlace{}, fmt.Errorf("%s joining the waitlist: %d %v %v", user, a.code, a.body, err)
		}
		return linePlace{user: user, id: a.str("admission_id"), state: a.str("state"), position: int(pos)}, nil
	}
	listed := make([]linePlace, n)
	lt.c.eventually(20*time.Second, "the case sold out: the waitlist open", func() error {
		var err error
		listed[0], err = join("listed-000000")
		return err
	})
	start := time.Now()
	forAll(lt.t, n-1, lineWorkers, func(i int) error {
		var err error
		listed[i+1], err = join(fmt.Sprintf("listed-%06d", i+1))
		return err
	})
	sort.Slice(listed, func(x, y int) bool { return listed[x].position < listed[y].position })
	for i, p := range listed {
		if p.position != i+1 {
			lt.t.Fatalf("the waitlist's positions: %s told %d, want %d (every position once)", p.user, p.position, i+1)
		}
	}
	lt.listed = listed
	lt.t.Logf("%d buyers joined the case's waitlist at region-us in %s", n, time.Since(start).Round(time.Millisecond))
}

// offerToTheFirst releases us's case hold and waits until the waitlist's first buyer has
// the offer of it: admitted, with a ticket for the case.
func (lt *lineTest) offerToTheFirst() {
	rel := edgeCall(lt.ctx, lt.t, lt.hc, "POST", lt.atA+"/v1/holds/"+lt.caseHold+"/release", nil)
	if rel.code != http.StatusOK || rel.str("state") != "released" {
		lt.t.Fatalf("releasing us's case hold %s: %d %v", lt.caseHold, rel.code, rel.body)
	}
	lt.c.eventually(20*time.Second, "the offer to the waitlist's first buyer", func() error {
		p, err := pollPlace(lt.ctx, lt.hc, admissionsAt(lt.atA), lt.listed[0])
		if err == nil && (p.state != "admitted" || p.ticket == "") {
			err = fmt.Errorf("%s: %s", p.user, p.state)
		}
		return err
	})
}

// afterTakeover: every ticket out before the kill reserves at the new leader, the waitlist's
// offer too, and the cap holds while the new leader admits the next buyers.
func (lt *lineTest) afterTakeover(before, listBefore []linePlace) {
	for _, p := range before {
		if p.state == "admitted" {
			reserveWith(lt.ctx, lt.t, lt.hc, lt.atB, "phone", p, http.StatusCreated)
		}
	}
	reserveWith(lt.ctx, lt.t, lt.hc, lt.atB, "case", listBefore[0], http.StatusCreated)
	lt.c.eventually(lt.within, "the new leader admits the next buyers", func() error {
		next := lt.snapshot(lt.atB, lt.places)
		if live, _ := liveOf(next); live > lineMaxLive {
			lt.t.Fatalf("%d live tickets after the takeover, over max_live_tickets %d", live, lineMaxLive)
		} else if live < lineMaxLive {
			return fmt.Errorf("%d live", live)
		}
		return nil
	})
}

// checkPlaces compares every buyer's place in what (the room, the waitlist) before and after
// the takeover; at most maxLive of them may be admitted after it.
func checkPlaces(t *testing.T, what string, before, after []linePlace, maxLive int) {
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
		t.Errorf("%d admitted in %s after the takeover, over %d", live, what, maxLive)
	}
	if bad > 0 {
		t.Fatalf("%d buyers lost their place in %s", bad, what)
	}
	t.Logf("%s: %d buyers kept their place (%d queued, %d admitted)", what, len(before), len(queued), live)
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

// reserveWith reserves one unit of sku in the line's sale with p's ticket, wants code and
// returns the answer.
func reserveWith(ctx context.Context, t *testing.T, hc *http.Client, base, sku string, p linePlace, code int) edgeAnswer {
	t.Helper()
	r := edgeCall(ctx, t, hc, "POST", base+"/v1/sales/"+lineSale+"/reservations",
		map[string]any{"ticket": p.ticket, "sku": sku, "quantity": 1, "request_key": "k-" + p.user})
	if r.code != code || (code == http.StatusCreated && r.str("admission_id") != p.id) {
		t.Fatalf("%s reserving a %s at %s: %d %v, want %d", p.user, sku, base, r.code, r.body, code)
	}
	return r
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
