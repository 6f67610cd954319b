package region_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"pgregory.net/rapid"
)

// The reference model of one sale in one region: what every operation must answer and how
// the counters must move, written as plainly as possible.

type modelHold struct {
	id, user, sku, key string
	qty                int64
	state              region.HoldState
	exp                time.Time
	payment            string
}

type modelPool struct {
	credited          bool // whether a pool row exists
	credit            int64
	avail, held, sold int64
}

type model struct {
	limit int64
	ttl   time.Duration
	pools map[string]*modelPool
	holds []*modelHold // in creation order
	byID  map[string]*modelHold
	byKey map[[2]string]*modelHold // (user, key)
	late  map[[2]string]bool       // (hold, payment)
}

func (m *model) used(user, sku string) int64 {
	var n int64
	for _, h := range m.holds {
		if h.user == user && h.sku == sku && (h.state == region.Held || h.state == region.Sold) {
			n += h.qty
		}
	}
	return n
}

// reserve returns the expected outcome class and, for "ok", the hold a replay must return
// (nil for a new grant, which the caller adds once it knows the id).
func (m *model) reserve(user, sku, key string, qty int64) (string, *modelHold) {
	if qty > m.limit {
		return "invalid:quantity", nil
	}
	if h, ok := m.byKey[[2]string{user, key}]; ok {
		if h.sku == sku && h.qty == qty {
			return "ok", h
		}
		return "exists", nil
	}
	p := m.pools[sku]
	if p.avail < qty {
		return "exhausted", nil
	}
	if m.used(user, sku)+qty > m.limit {
		return "limit", nil
	}
	return "ok", nil
}

func (m *model) grant(id, user, sku, key string, qty int64, now time.Time) {
	h := &modelHold{id: id, user: user, sku: sku, key: key, qty: qty, state: region.Held, exp: now.Add(m.ttl)}
	m.holds = append(m.holds, h)
	m.byID[id] = h
	m.byKey[[2]string{user, key}] = h
	p := m.pools[sku]
	p.avail -= qty
	p.held += qty
}

func (m *model) close(h *modelHold, to region.HoldState) {
	p := m.pools[h.sku]
	p.held -= h.qty
	if to == region.Sold {
		p.sold += h.qty
	} else {
		p.avail += h.qty
	}
	h.state = to
}

// confirm returns (class, sold, the state and payment of the returned hold).
func (m *model) confirm(id, pay string, now time.Time) (string, bool, region.HoldState, string) {
	h, ok := m.byID[id]
	if !ok {
		return "notfound", false, "", ""
	}
	switch {
	case h.state == region.Sold && h.payment == pay:
		return "ok", true, h.state, h.payment
	case h.state == region.Held && now.Before(h.exp):
		m.close(h, region.Sold)
		h.payment = pay
		return "ok", true, h.state, h.payment
	case h.state == region.Held:
		m.close(h, region.Expired)
	}
	m.late[[2]string{id, pay}] = true
	return "ok", false, h.state, h.payment
}

func (m *model) release(id string) (string, region.HoldState) {
	h, ok := m.byID[id]
	if !ok {
		return "notfound", ""
	}
	switch h.state {
	case region.Sold:
		return "conflict", ""
	case region.Held:
		m.close(h, region.Released)
	}
	return "ok", h.state
}

func (m *model) sweep(now time.Time) int {
	n := 0
	for _, h := range m.holds {
		if h.state == region.Held && !h.exp.After(now) {
			m.close(h, region.Expired)
			n++
		}
	}
	return n
}

// TestRegionMatchesModel drives random sequences of reserve (3 users, 2 SKUs, 3 keys, so
// retries and key reuse are frequent), confirm, release, clock moves, sweeps and leader
// takeovers against one region, and after every step compares the answer with the model's
// and the stored pools, holds and books with the model's (I1–I3, hold sums, per-user
// counts). One database for the whole check; each case gets its own sale.
//
// It runs twice: with the default retention of closed holds, and retiring every closed hold
// from memory as soon as the clock moves (archive.go), so that replays, confirms and releases
// of closed holds are decided from SQL.
func TestRegionMatchesModel(t *testing.T) {
	t.Run("retain default", func(t *testing.T) { checkRegionMatchesModel(t, newEnv(t)) })
	t.Run("retain 1ns", func(t *testing.T) {
		checkRegionMatchesModel(t, newEnv(t, func(c *region.Config) { c.Sweep.RetainClosed = time.Nanosecond }))
	})
}

// checkRegionMatchesModel is TestRegionMatchesModel's check against the region of e.
func checkRegionMatchesModel(t *testing.T, e *env) {
	iter := 0
	seen := map[string]int{} // outcome → how often, to show what the runs covered
	rapid.Check(t, func(rt *rapid.T) {
		iter++
		c := &modelCase{rt: rt, e: e, sale: fmt.Sprintf("m%d", iter), seen: seen}
		c.start()
		steps := 30 - rapid.IntRange(0, 29).Draw(rt, "fewer_steps")
		seen["steps"] += steps
		for range steps {
			c.step()
			checkModel(rt, e, c.sale, c.m)
		}
		var late int
		if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM late_payments l JOIN holds h USING (hold_id) WHERE h.sale_id = $1`, c.sale).Scan(&late); err != nil {
			rt.Fatal(err)
		}
		if late != len(c.m.late) {
			rt.Fatalf("%d late payments recorded, model says %d", late, len(c.m.late))
		}
	})
	outcomes := make([]string, 0, len(seen))
	for k, v := range seen {
		outcomes = append(outcomes, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(outcomes)
	t.Logf("%d cases; outcomes:\n%s", iter, strings.Join(outcomes, "\n"))
}

// The draws of TestRegionMatchesModel: few users, SKUs, keys and payments, so that retries,
// key reuse and limits come up often.
var (
	modelSKUs     = []string{"a", "b"}
	modelUsers    = []string{"u0", "u1", "u2"}
	modelKeys     = []string{"k0", "k1", "k2"}
	modelPayments = []string{"p0", "p1"}
)

const modelTTL = 10 * time.Second

// modelCase is one case of TestRegionMatchesModel: a sale of its own, its model, and the
// outcome counts shared by all cases.
type modelCase struct {
	rt   *rapid.T
	e    *env
	sale string
	m    *model
	seen map[string]int
}

// start closes what earlier cases left open, puts the case's sale and credits its pools.
func (c *modelCase) start() {
	rt, e, ctx := c.rt, c.e, c.e.ctx
	// Close everything a previous (possibly failed) case left open, so sweep counts are
	// this case's alone.
	e.clk.Advance(24 * time.Hour)
	if _, err := e.r.SweepNow(ctx); err != nil {
		rt.Fatalf("sweep: %v", err)
	}
	c.m = &model{limit: 3, ttl: modelTTL, pools: map[string]*modelPool{}, byID: map[string]*modelHold{},
		byKey: map[[2]string]*modelHold{}, late: map[[2]string]bool{}}
	if err := e.r.PutSale(ctx, 1, region.SaleTerms{Sale: c.sale, SKUs: modelSKUs, PerUserLimit: 3, HoldTTL: modelTTL,
		OpensAt: e.clk.Now().Add(-time.Minute)}); err != nil {
		rt.Fatalf("put sale: %v", err)
	}
	for _, sku := range modelSKUs {
		// Drawn as a shortfall so that shrinking goes towards plenty: 9 means no credit (no
		// pool row at all).
		units := 8 - rapid.IntRange(0, 9).Draw(rt, "shortfall_"+sku)
		p := &modelPool{}
		c.m.pools[sku] = p
		if units < 0 {
			continue
		}
		if _, err := e.r.Credit(ctx, region.CreditRequest{Generation: 1, TransferID: c.sale + "-" + sku, Sale: c.sale, SKU: sku, Units: transfer.Units(units)}); err != nil {
			rt.Fatalf("credit: %v", err)
		}
		p.credited, p.credit, p.avail = true, int64(units), int64(units)
	}
	checkModel(rt, e, c.sale, c.m)
}

// step draws one action, runs it against the region and the model, and compares answers.
func (c *modelCase) step() {
	rt, e, m := c.rt, c.e, c.m
	now := e.clk.Now()
	switch action := rapid.IntRange(0, 10).Draw(rt, "action"); {
	case action <= 3:
		c.reserve(now)
	case action <= 5:
		c.confirm(now)
	case action == 6:
		c.release()
	case action == 7:
		ms := rapid.Int64Range(0, 15000).Draw(rt, "advance_ms")
		e.clk.Advance(time.Duration(ms) * time.Millisecond)
	case action == 8:
		// Move exactly onto a hold's deadline, where sell and expire meet.
		if len(m.holds) == 0 {
			break
		}
		h := m.holds[rapid.IntRange(0, len(m.holds)-1).Draw(rt, "deadline_of")]
		if d := h.exp.Sub(now); d > 0 {
			e.clk.Advance(d)
		}
	case action == 10:
		// A new leader loads from SQL: closed holds past their retention are retired at once.
		c.seen["takeover"]++
		e.takeOver()
	default:
		want := m.sweep(now)
		c.seen[fmt.Sprintf("sweep expired>0=%v", want > 0)]++
		n, err := e.r.SweepNow(e.ctx)
		if err != nil || n != want {
			rt.Fatalf("sweep expired %d (%v), model says %d", n, err, want)
		}
	}
}

// reserve draws a reserve (1..3 units, now and then 4: over the per-user limit of 3).
func (c *modelCase) reserve(now time.Time) {
	rt, m := c.rt, c.m
	user := rapid.SampledFrom(modelUsers).Draw(rt, "user")
	sku := rapid.SampledFrom(modelSKUs).Draw(rt, "sku")
	key := rapid.SampledFrom(modelKeys).Draw(rt, "key")
	qty := 1 + rapid.Int64Range(0, 9).Draw(rt, "qty")%3
	if rapid.IntRange(0, 9).Draw(rt, "over_limit") == 9 {
		qty = 4
	}
	want, prior := m.reserve(user, sku, key, qty)
	res, err := c.e.r.Reserve(c.e.ctx, region.ReserveRequest{Sale: c.sale, SKU: sku, User: user, Quantity: transfer.Units(qty), RequestKey: key})
	c.seen["reserve "+want]++
	if prior != nil {
		c.seen["reserve replay"]++
	}
	if got := errClass(err); got != want {
		rt.Fatalf("reserve %s/%s/%s x%d: %s (%v), model says %s", user, sku, key, qty, got, err, want)
	}
	if err != nil {
		return
	}
	h := res.Hold
	if h.Sale != c.sale || h.SKU != sku || h.User != user || int64(h.Quantity) != qty || h.RequestKey != key || h.Region != "us" {
		rt.Fatalf("reserve returned %+v", h)
	}
	if prior != nil {
		if !res.Replayed || h.ID != prior.id || h.State != prior.state || h.PaymentID != prior.payment || !h.ExpiresAt.Equal(prior.exp) {
			rt.Fatalf("replay returned %+v (replayed %v), model hold %+v", h, res.Replayed, *prior)
		}
		return
	}
	if res.Replayed || h.State != region.Held || !h.ExpiresAt.Equal(now.Add(modelTTL)) || m.byID[h.ID] != nil {
		rt.Fatalf("new grant returned %+v (replayed %v)", h, res.Replayed)
	}
	m.grant(h.ID, user, sku, key, qty, now)
}

// confirm draws a confirm of a model hold (or of an unknown id) with one of two payments.
func (c *modelCase) confirm(now time.Time) {
	rt := c.rt
	id := pickHold(rt, c.m)
	pay := rapid.SampledFrom(modelPayments).Draw(rt, "payment")
	want, sold, state, payment := c.m.confirm(id, pay, now)
	c.seen[fmt.Sprintf("confirm %s sold=%v %s", want, sold, state)]++
	res, err := c.e.r.Confirm(c.e.ctx, id, pay)
	if got := errClass(err); got != want {
		rt.Fatalf("confirm %s %s: %s (%v), model says %s", id, pay, got, err, want)
	}
	if err == nil && (res.Sold != sold || res.Hold.State != state || res.Hold.PaymentID != payment || res.Hold.ID != id) {
		rt.Fatalf("confirm %s %s = sold %v %s %q, model says sold %v %s %q", id, pay,
			res.Sold, res.Hold.State, res.Hold.PaymentID, sold, state, payment)
	}
}

// release draws a release of a model hold (or of an unknown id).
func (c *modelCase) release() {
	rt := c.rt
	id := pickHold(rt, c.m)
	want, state := c.m.release(id)
	c.seen[fmt.Sprintf("release %s %s", want, state)]++
	h, err := c.e.r.Release(c.e.ctx, id)
	if got := errClass(err); got != want {
		rt.Fatalf("release %s: %s (%v), model says %s", id, got, err, want)
	}
	if err == nil && (h.State != state || h.ID != id) {
		rt.Fatalf("release %s returned state %s, model says %s", id, h.State, state)
	}
}

// pickHold draws one of the model's holds, or (sometimes) an id no hold has.
func pickHold(rt *rapid.T, m *model) string {
	if len(m.holds) == 0 || rapid.IntRange(0, 9).Draw(rt, "unknown_hold") == 9 {
		return "us.000000000000000000000000"
	}
	return m.holds[rapid.IntRange(0, len(m.holds)-1).Draw(rt, "hold")].id
}

// checkModel compares the stored pools and holds of sale with the model and checks the books.
func checkModel(rt *rapid.T, e *env, sale string, m *model) {
	ctx := context.Background()
	ps, err := e.r.Stock(ctx, sale)
	if err != nil {
		rt.Fatalf("stock: %v", err)
	}
	got := map[string]region.PoolCounts{}
	for _, p := range ps {
		got[p.SKU] = p
	}
	for sku, mp := range m.pools {
		p, ok := got[sku]
		if ok != mp.credited {
			rt.Fatalf("pool %s exists %v, model says %v", sku, ok, mp.credited)
		}
		if int64(p.Available) != mp.avail || int64(p.Held) != mp.held || int64(p.Sold) != mp.sold ||
			int64(p.CreditedIn) != mp.credit || p.DebitedOut != 0 {
			rt.Fatalf("pool %s: %+v, model says %+v", sku, p, *mp)
		}
		// I1 within the region: the units credited are all in exactly one of the terms.
		if mp.avail+mp.held+mp.sold != mp.credit {
			rt.Fatalf("model broke conservation: %+v", *mp)
		}
	}
	if err := checkBooks(ctx, e.pool, sale); err != nil {
		rt.Fatal(err)
	}
	rows, err := e.pool.Query(ctx, `SELECT hold_id, state, coalesce(payment_id, '') FROM holds WHERE sale_id = $1`, sale)
	if err != nil {
		rt.Fatal(err)
	}
	var diffs []string
	n := 0
	for rows.Next() {
		var id, state, pay string
		if err := rows.Scan(&id, &state, &pay); err != nil {
			rt.Fatal(err)
		}
		n++
		h := m.byID[id]
		switch {
		case h == nil:
			diffs = append(diffs, fmt.Sprintf("stored hold %s is not in the model", id))
		case string(h.state) != state || h.payment != pay:
			diffs = append(diffs, fmt.Sprintf("hold %s stored %s/%q, model %s/%q", id, state, pay, h.state, h.payment))
		}
	}
	if err := rows.Err(); err != nil {
		rt.Fatal(err)
	}
	if n != len(m.holds) {
		diffs = append(diffs, fmt.Sprintf("%d holds stored, model has %d", n, len(m.holds)))
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		rt.Fatal(strings.Join(diffs, "\n"))
	}
}
