package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// RebalanceMode is whether the automatic rebalancer moves a sale's stock.
type RebalanceMode string

// The rebalance modes of a sale.
const (
	// RebalanceAuto: the leader's rebalancer moves the sale's stock by itself (the default).
	RebalanceAuto RebalanceMode = "auto"
	// RebalanceManual: only operators move it (quotactl transfer, rebalance).
	RebalanceManual RebalanceMode = "manual"
)

// CheckRebalanceMode refuses a mode other than auto and manual ("" is auto).
func CheckRebalanceMode(m RebalanceMode) error {
	switch m {
	case "", RebalanceAuto, RebalanceManual:
		return nil
	}
	return apierr.Invalid("rebalance", "%q: want auto or manual", m)
}

// AutoRebalance tunes the automatic rebalancer (Config.Auto).
type AutoRebalance struct {
	// Enabled is the global switch: without it no sale is rebalanced automatically,
	// whatever its mode.
	Enabled bool
	// Every is how often the leader plans; default 200ms.
	Every time.Duration
	// Policy is the plan's rule: demand over Window, expected to go on for Horizon, moves of
	// at least MinUnits (but near sell-out, transfer.Policy.AutoPlan); default 3s, 10s, 5.
	Policy transfer.Policy
	// MaxInFlight caps the unfinished transfers of one SKU, its own and any operator's; the
	// rebalancer starts none while the SKU has as many; default 3.
	MaxInFlight int
	// Cooldown is how long the rebalancer waits after moving a SKU's units before it moves
	// that SKU's again; default 200ms.
	Cooldown time.Duration
}

// minRebalanceEvery is the shortest interval between the rebalancer's rounds.
const minRebalanceEvery = 50 * time.Millisecond

// Default automatic rebalancer settings.
const (
	DefaultRebalanceEvery       = 200 * time.Millisecond
	DefaultRebalanceWindow      = 3 * time.Second
	DefaultRebalanceHorizon     = 10 * time.Second
	DefaultRebalanceMinUnits    = 5
	DefaultRebalanceMaxInFlight = 3
	DefaultRebalanceCooldown    = 200 * time.Millisecond
)

// withDefaults fills in the unset settings and checks the set ones.
func (a *AutoRebalance) withDefaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&a.Every, DefaultRebalanceEvery)
	def(&a.Policy.Window, DefaultRebalanceWindow)
	def(&a.Policy.Horizon, DefaultRebalanceHorizon)
	def(&a.Cooldown, DefaultRebalanceCooldown)
	if a.Policy.MinUnits == 0 {
		a.Policy.MinUnits = DefaultRebalanceMinUnits
	}
	if a.MaxInFlight == 0 {
		a.MaxInFlight = DefaultRebalanceMaxInFlight
	}
	switch {
	case a.Every < 0 || a.Policy.Window < 0 || a.Policy.Horizon < 0 || a.Cooldown < 0:
		return errors.New("auto rebalance: interval, window, horizon and cooldown must be positive")
	case a.Policy.MinUnits < 0 || a.MaxInFlight < 0 || a.MaxInFlight > 100:
		return errors.New("auto rebalance: min units must be positive, transfers in flight 1..100")
	case a.Every < minRebalanceEvery:
		return fmt.Errorf("auto rebalance: interval %s: at least %s (each round reads every region)", a.Every, minRebalanceEvery)
	}
	return nil
}

// PoolPlan is one pool in a plan: what was read of it and what the plan expects of it
// (transfer.PoolPlan).
type PoolPlan = transfer.PoolPlan

// SKUPlan is the automatic rebalancer's next step for one SKU and why.
type SKUPlan struct {
	SKU         string
	Pools       []PoolPlan
	NearSellOut bool
	InFlight    int
	// Moves is what the rebalancer would start now; Held says why it starts nothing even
	// though Moves is not empty ("" when it would start them).
	Moves []transfer.Move
	Held  string
}

// SalePlan is the automatic rebalancer's next step for each SKU of a sale.
type SalePlan struct {
	Sale    string
	Mode    RebalanceMode
	Enabled bool // the global switch
	At      time.Time
	SKUs    []SKUPlan
}

// rebalancer moves units toward the regions selling fastest: on an operator's request
// (rebalance.go) and, while this coordinator leads, by itself every Auto.Every (loop). Its
// moves are transfers it starts through transfer (the facade's Transfer); generation tells
// whether this coordinator leads.
type rebalancer struct {
	cfg        *Config
	ledger     *ledger
	regions    *regionSet
	generation func() (int64, error)
	transfer   func(context.Context, TransferRequest) (transfer.Transfer, bool, error)
	// state is the automatic rebalancer's memory of its current or last term (nil before
	// the first).
	state atomic.Pointer[autoState]
	// moves and units count the transfers the automatic rebalancer started and their
	// units, in this process's life.
	moves, units atomic.Int64
}

// newState is the automatic rebalancer's memory of a new term, its cooldown running; the
// caller completes it (live) and then stores it in state.
func (rb *rebalancer) newState() *autoState {
	return &autoState{moved: map[skuKey]time.Time{}, idle: map[string]time.Time{}, idleRuns: map[string]int{}, since: rb.cfg.Clock.Now()}
}

// autoState is the leader's memory of its own moves: when it last moved each SKU, and a
// sequence for its transfers' request ids. A new leader starts with the cooldown running.
type autoState struct {
	mu    sync.Mutex
	moved map[skuKey]time.Time
	since time.Time
	seq   int64
	// idle is, per sale found without demand and without moves, when to plan it again, and
	// idleRuns how many plans in a row found it so: a sale that sold out or whose buyers are
	// gone is planned again when its stock or ledger changes (wake), when it opens, or after
	// a wait that doubles from maxIdleWait to maxIdleBackoff while the change feed is live
	// (every maxIdleWait while it is not). Bounded by the sales one round plans (keepOnly);
	// moved by the SKUs moved within a cooldown (moving).
	idle     map[string]time.Time
	idleRuns map[string]int
	// wakes counts the wakes of each sale a plan has read (wakeCount registers it), so a
	// plan read while a change came in is not taken for idle (planned): a wake is never lost
	// to the plan it raced. Bounded like idle (keepOnly); empty while the rebalancer is off.
	wakes map[string]uint64
	// live reports whether every source of changes is listening (changeFeed.live); nil: no.
	live func() bool
}

// maxIdleWait is how long an idle sale first waits between plans, and always when changes
// are not told: how late the rebalancer may notice the first buyers of a sale that no change
// of stock announces.
const maxIdleWait = 2 * time.Second

// maxIdleBackoff bounds the wait of a sale idle for long while changes are told.
const maxIdleBackoff = 30 * time.Second

// keepOnly forgets the idle marks of sales not in sales (those no round plans any more).
func (s *autoState) keepOnly(sales []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sale := range s.idle {
		if !slices.Contains(sales, sale) {
			delete(s.idle, sale)
			delete(s.idleRuns, sale)
		}
	}
	for sale := range s.wakes {
		if !slices.Contains(sales, sale) {
			delete(s.wakes, sale)
		}
	}
}

// due reports whether sale should be planned at now.
func (s *autoState) due(sale string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !now.Before(s.idle[sale])
}

// wake plans sale at the next round: its stock or its ledger rows changed.
func (s *autoState) wake(sale string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.idle, sale)
	delete(s.idleRuns, sale)
	if n, ok := s.wakes[sale]; ok { // counted only for sales a plan reads
		s.wakes[sale] = n + 1
	}
}

// wakeCount is how many times sale was woken since a plan first read it: read before its
// plan, given to planned. It registers sale, whose wakes are counted from now on.
func (s *autoState) wakeCount(sale string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wakes == nil {
		s.wakes = map[string]uint64{}
	}
	n, ok := s.wakes[sale]
	if !ok {
		s.wakes[sale] = 0
	}
	return n
}

// planned records whether sale's plan at now found it idle; a sale not yet open is planned
// again when it opens at the latest, and one open for less than maxIdleBackoff waits
// maxIdleWait at most, so its first buyers are seen within 2 s. wakes is wakeCount from
// before the plan was read: a sale woken since is planned again next round, idle or not.
func (s *autoState) planned(sale string, idle bool, now, opensAt time.Time, wakes uint64) {
	live := s.live != nil && s.live()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !idle || s.wakes[sale] != wakes {
		delete(s.idle, sale)
		delete(s.idleRuns, sale)
		return
	}
	wait := maxIdleWait
	if live && now.Sub(opensAt) > maxIdleBackoff { // in its first 30 s open, every 2 s at most
		wait = min(maxIdleWait<<min(s.idleRuns[sale], 4), maxIdleBackoff)
	}
	s.idleRuns[sale]++
	next := now.Add(wait)
	if opensAt.After(now) && opensAt.Before(next) {
		next = opensAt
	}
	s.idle[sale] = next
}

// idlePlan reports whether a plan found no demand anywhere and nothing to move.
func idlePlan(p SalePlan) bool {
	for _, k := range p.SKUs {
		if len(k.Moves) > 0 || k.InFlight > 0 {
			return false
		}
		for _, d := range k.Pools {
			if d.Recent > 0 {
				return false
			}
		}
	}
	return true
}

// lastMove is when key last moved, or when this term began.
func (s *autoState) lastMove(k skuKey) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.moved[k]; ok {
		return t
	}
	return s.since
}

// moving records a move of key at now and answers its request id's sequence number. Moves
// older than cooldown are forgotten: they hold nothing back any more.
func (s *autoState) moving(k skuKey, now time.Time, cooldown time.Duration) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for old, at := range s.moved {
		if now.Sub(at) > cooldown {
			delete(s.moved, old)
		}
	}
	s.moved[k] = now
	s.seq++
	return s.seq
}

// PlanRebalance is what the automatic rebalancer would do next for each SKU of sale, and
// why: each pool's available units, recent demand, units on their way, need and projected
// time to empty, the moves, and what holds them back (the sale's mode, the global switch, a
// pause, the cap on transfers in flight, the cooldown). It reads; it moves nothing.
func (c *Coordinator) PlanRebalance(ctx context.Context, sale string) (SalePlan, error) {
	return c.rebal.plan(ctx, sale)
}

// plan is PlanRebalance.
func (rb *rebalancer) plan(ctx context.Context, sale string) (SalePlan, error) {
	s, err := rb.ledger.sale(ctx, sale)
	if err != nil {
		return SalePlan{}, err
	}
	now := rb.cfg.Clock.Now()
	open, err := rb.openTransfersOf(ctx, sale, now.Add(-rb.cfg.Auto.Policy.Window))
	if err != nil {
		return SalePlan{}, err
	}
	plan := SalePlan{Sale: sale, Mode: s.Rebalance, Enabled: rb.cfg.Auto.Enabled, At: now}
	regions := rb.readPoolDemand(ctx, sale, now.Add(-rb.cfg.Auto.Policy.Window))
	for _, k := range s.SKUs {
		pools := append([]transfer.PoolDemand{{Pool: transfer.Unallocated, Available: k.Unallocated}}, regions[k.SKU]...)
		sp := planSKU(rb.cfg.Auto.Policy.SinceOpening(s.Terms.OpensAt, now), k.SKU, pools, open[k.SKU])
		sp.Held = rb.heldBecause(plan, s, sp, now)
		plan.SKUs = append(plan.SKUs, sp)
	}
	return plan, nil
}

// planSKU is one SKU's plan under p from its pools and its recent transfers: the pure rule
// transfer.Policy.AutoRound, which the deterministic simulation runs as well.
func planSKU(p transfer.Policy, sku string, pools []transfer.PoolDemand, recent []transfer.Transfer) SKUPlan {
	r := p.AutoRound(pools, recent)
	return SKUPlan{SKU: sku, Pools: r.Pools, NearSellOut: r.NearSellOut, InFlight: r.InFlight, Moves: r.Moves}
}

// heldBecause is why the rebalancer would start none of sp's moves now, or "".
func (rb *rebalancer) heldBecause(plan SalePlan, s Sale, sp SKUPlan, now time.Time) string {
	if len(sp.Moves) == 0 {
		return ""
	}
	_, notLeader := rb.generation()
	switch {
	case notLeader != nil:
		return "this coordinator does not lead: its leader's rebalancer decides"
	case !plan.Enabled:
		return "automatic rebalancing is off on this coordinator (quotad coordinator --auto-rebalance)"
	case plan.Mode != RebalanceAuto:
		return "the sale is rebalanced by operators only (--rebalance manual)"
	case pausedSKU(s.Pauses, sp.SKU):
		return "the SKU is paused"
	case sp.InFlight >= rb.cfg.Auto.MaxInFlight:
		return fmt.Sprintf("%d transfers of this SKU in flight (at most %d)", sp.InFlight, rb.cfg.Auto.MaxInFlight)
	}
	if st := rb.state.Load(); st != nil {
		if wait := st.lastMove(skuKey{s.Terms.Sale, sp.SKU}).Add(rb.cfg.Auto.Cooldown).Sub(now); wait > 0 {
			return fmt.Sprintf("cooling down for %s after its last move", wait.Round(time.Millisecond))
		}
	}
	return ""
}

// pausedSKU reports whether a pause in force stops new holds of sku (its own or the sale's).
func pausedSKU(pauses []Pause, sku string) bool {
	for _, p := range pauses {
		if p.Paused && (p.SKU == "" || p.SKU == sku) {
			return true
		}
	}
	return false
}

// openTransfersOf is sale's unfinished transfers (requested or pending) and those posted since
// fedSince, by SKU.
func (rb *rebalancer) openTransfersOf(ctx context.Context, sale string, fedSince time.Time) (map[string][]transfer.Transfer, error) {
	rows, err := rb.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE sale_id = $1 AND (state IN ('requested', 'pending') OR (state = 'posted' AND created_at >= $2))
		ORDER BY created_at`, sale, fedSince)
	if err != nil {
		return nil, fmt.Errorf("read the sale's transfers in flight: %w", err)
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil {
		return nil, fmt.Errorf("read the sale's transfers in flight: %w", err)
	}
	out := map[string][]transfer.Transfer{}
	for _, t := range ts {
		out[t.SKU] = append(out[t.SKU], t)
	}
	return out, nil
}

// readPoolDemand reads every region's available units and recent demand of sale, per SKU,
// in the order of the configured regions, the regions read at once. A region that cannot be read is left out of the
// plan, neither source nor destination: its pool is never reassigned.
func (rb *rebalancer) readPoolDemand(ctx context.Context, sale string, since time.Time) map[string][]transfer.PoolDemand {
	type read struct {
		avail, recent map[string]transfer.Units
		err           error
	}
	reads := make([]read, len(rb.cfg.Regions))
	var wg sync.WaitGroup
	for i, r := range rb.cfg.Regions { // at once: a region that hangs costs one CallTimeout, not one each
		wg.Add(1)
		go func() {
			defer wg.Done()
			reads[i].avail, reads[i].recent, reads[i].err = rb.poolsOf(ctx, r, sale, since)
		}()
	}
	wg.Wait()
	out := map[string][]transfer.PoolDemand{}
	for i, r := range rb.cfg.Regions {
		avail, recent, err := reads[i].avail, reads[i].recent, reads[i].err
		if err != nil {
			rb.cfg.Logger.Warn("rebalance: region unreadable, left out of the plan", "region", r.Name, "sale", sale, "err", err)
			continue
		}
		for sku, a := range avail {
			out[sku] = append(out[sku], transfer.PoolDemand{Pool: r.Name, Available: a, Recent: recent[sku]})
		}
		for sku, n := range recent { // buyers refused at a region that never had a pool of it
			if _, ok := avail[sku]; !ok {
				out[sku] = append(out[sku], transfer.PoolDemand{Pool: r.Name, Recent: n})
			}
		}
	}
	for _, pools := range out {
		sort.SliceStable(pools, func(i, j int) bool { return rb.regions.index(pools[i].Pool) < rb.regions.index(pools[j].Pool) })
	}
	return out
}

// poolsOf reads one region's available units and recent demand per SKU of sale, bounded in
// time by CallTimeout.
func (rb *rebalancer) poolsOf(ctx context.Context, r RegionLink, sale string, since time.Time) (map[string]transfer.Units, map[string]transfer.Units, error) {
	ctx, cancel := context.WithTimeout(ctx, rb.cfg.CallTimeout)
	defer cancel()
	avail := map[string]transfer.Units{}
	if r.Unsold != nil {
		stock, err := r.Unsold(ctx, sale)
		if err != nil {
			return nil, nil, err
		}
		for sku, s := range stock {
			avail[sku] = s.Available
		}
	} else {
		books, err := r.Books(ctx, sale)
		if err != nil {
			return nil, nil, err
		}
		for _, p := range books.Pools {
			avail[p.SKU] = p.Available
		}
	}
	recent := map[string]transfer.Units{}
	if r.Demand != nil {
		var err error
		if recent, err = r.Demand(ctx, sale, since); err != nil {
			return nil, nil, err
		}
	}
	return avail, recent, nil
}

// loop is the automatic rebalancer while this coordinator leads with gen: every
// Auto.Every it plans each auto sale and starts the moves nothing holds back.
func (rb *rebalancer) loop(ctx context.Context, gen int64) {
	if !rb.cfg.Auto.Enabled {
		return
	}
	every(ctx, rb.cfg.Auto.Every, func() {
		if err := rb.round(ctx, gen); err != nil && ctx.Err() == nil {
			rb.cfg.Logger.Warn("automatic rebalance round failed; the next round tries again", "err", err)
		}
	})
}

// maxAutoSales bounds the sales one round plans, the most recently created first.
const maxAutoSales = 64

// round plans every sale in auto mode that still has units to sell and starts its moves.
// Each move is a fenced transfer like an operator's (I1..I4); a new leader resumes those
// this one started (transferDriver.loop) and plans from what the regions and the ledger then say.
func (rb *rebalancer) round(ctx context.Context, gen int64) error {
	rows, err := rb.ledger.db.Query(ctx, `SELECT s.sale_id, s.opens_at FROM sales s WHERE s.rebalance = 'auto'
		AND EXISTS (SELECT 1 FROM skus k WHERE k.sale_id = s.sale_id)
		ORDER BY s.created_at DESC LIMIT $1`, maxAutoSales)
	if err != nil {
		return fmt.Errorf("list the sales to rebalance: %w", err)
	}
	type autoSale struct {
		ID      string
		OpensAt time.Time
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[autoSale])
	if err != nil {
		return fmt.Errorf("list the sales to rebalance: %w", err)
	}
	var errs []error
	st := rb.state.Load()
	sales := make([]string, len(list))
	for i, s := range list {
		sales[i] = s.ID
	}
	st.keepOnly(sales)
	for _, s := range list {
		sale := s.ID
		if !st.due(sale, rb.cfg.Clock.Now()) {
			continue
		}
		wakes := st.wakeCount(sale)
		plan, err := rb.plan(ctx, sale)
		if err != nil {
			errs = append(errs, fmt.Errorf("plan sale %s: %w", sale, err))
			continue
		}
		st.planned(sale, idlePlan(plan), plan.At, s.OpensAt, wakes)
		for _, sp := range plan.SKUs {
			if err := rb.startMoves(ctx, gen, sale, sp); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// startMoves starts sp's moves, as many as the cap on transfers in flight leaves room for,
// unless something holds them back.
func (rb *rebalancer) startMoves(ctx context.Context, gen int64, sale string, sp SKUPlan) error {
	if sp.Held != "" || len(sp.Moves) == 0 {
		return nil
	}
	st := rb.state.Load()
	room := rb.cfg.Auto.MaxInFlight - sp.InFlight
	for _, m := range sp.Moves[:min(room, len(sp.Moves))] {
		seq := st.moving(skuKey{sale, sp.SKU}, rb.cfg.Clock.Now(), rb.cfg.Auto.Cooldown)
		id := fmt.Sprintf("auto-%d-%d-%d", gen, st.since.UnixMilli(), seq)
		t, _, err := rb.transfer(ctx, TransferRequest{Sale: sale, SKU: sp.SKU, From: m.From, To: m.To, Units: m.Units, RequestID: id})
		if err != nil {
			return fmt.Errorf("automatic move of %d %s/%s %s → %s (request %s): %w", m.Units, sale, sp.SKU, m.From, m.To, id, err)
		}
		rb.moves.Add(1)
		rb.units.Add(int64(m.Units))
		rb.cfg.Logger.Info("automatic rebalance", "sale", sale, "sku", sp.SKU, "from", m.From, "to", m.To,
			"units", m.Units, "transfer", t.ID, "state", t.State, "near_sell_out", sp.NearSellOut)
	}
	return nil
}

// AutoMoves is the transfers the automatic rebalancer started in this process's life, and
// their units.
func (c *Coordinator) AutoMoves() (moves, units int64) {
	return c.rebal.moves.Load(), c.rebal.units.Load()
}

// AutoPolicy is the automatic rebalancer's policy, defaults filled in.
func (c *Coordinator) AutoPolicy() transfer.Policy { return c.cfg.Auto.Policy }
