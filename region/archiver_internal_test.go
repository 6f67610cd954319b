package region

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
)

// counts is what a state decides a buyer's limits and a pool's books from, once every buyer
// is resolved: per-user held and bought units (users at zero left out), request keys per
// buyer, and the pools.
type stateCounts struct {
	users   map[userKey]memUser
	keysPer map[saleUser]int32
	pools   map[poolKey]memPool
}

// resolvedCounts resolves every buyer of m that has holds stored (in holds or the archive)
// from SQL, as the writer would on first need, and returns m's counts. archivedSold must be
// zero everywhere after: every archived sold unit is then some buyer's.
func resolvedCounts(ctx context.Context, t *testing.T, r *Region, m *memState) stateCounts {
	t.Helper()
	rows, err := r.pool.Query(ctx, `SELECT sale_id, user_id FROM holds UNION SELECT sale_id, user_id FROM holds_closed`)
	if err != nil {
		t.Fatal(err)
	}
	var buyers []saleUser
	var su saleUser
	for rows.Next() {
		if err := rows.Scan(&su.sale, &su.user); err != nil {
			t.Fatal(err)
		}
		buyers = append(buyers, su)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got, err := readBuyers(ctx, r.pool, buyers)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range got {
		m.resolve(b)
	}
	c := stateCounts{users: map[userKey]memUser{}, keysPer: maps.Clone(m.keysPer), pools: map[poolKey]memPool{}}
	for k, u := range m.users {
		if *u != (memUser{}) {
			c.users[k] = *u
		}
	}
	for k, p := range m.pools {
		c.pools[k] = *p
	}
	for k, a := range m.archivedSold {
		if a != 0 {
			t.Errorf("pool %v: %d archived sold units in no buyer's count after every buyer was resolved", k, a)
		}
	}
	return c
}

func (c stateCounts) String() string {
	return fmt.Sprintf("users %v, keys %v, pools %v", c.users, c.keysPer, c.pools)
}

func sameCounts(a, b stateCounts) bool {
	return maps.Equal(a.users, b.users) && maps.Equal(a.keysPer, b.keysPer) && maps.Equal(a.pools, b.pools)
}

// tableRows counts the rows of holds and of holds_closed.
func tableRows(ctx context.Context, t *testing.T, r *Region) (live, archived int) {
	t.Helper()
	if err := r.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM holds), (SELECT count(*) FROM holds_closed)`).Scan(&live, &archived); err != nil {
		t.Fatal(err)
	}
	return live, archived
}

// TestArchiveMovesClosedHolds: once their retention has passed, closed holds move from holds
// to holds_closed, with their buyers' and pools' archived counts, exactly once; the leader
// drops them from memory; a takeover after the move (which reads no archived hold) has the
// same per-user counts and pools as one before it, and limits hold (I2); the books stay clean.
func TestArchiveMovesClosedHolds(t *testing.T) {
	old, ctx := newInternalRegion(t)
	if _, err := old.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t2", Sale: "s", SKU: "x", Units: 10}); err != nil {
		t.Fatal(err)
	}
	sold, released := mustReserveIn(t, old, ctx, "ann", "k1", 6), mustReserveIn(t, old, ctx, "bob", "k1", 1)
	live := mustReserveIn(t, old, ctx, "ann", "k2", 1)
	if _, err := old.Confirm(ctx, sold.ID, "pay-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Release(ctx, released.ID); err != nil {
		t.Fatal(err)
	}
	clk := old.cfg.Clock.(*clock.Manual)
	if n, err := old.ArchiveNow(ctx); err != nil || n != 0 {
		t.Fatalf("archive within the retention: %d moved, %v; want none", n, err)
	}
	clk.Advance(DefaultRetainClosed + time.Second)
	before, err := loadMem(ctx, old.pool, "us", clk.Now(), DefaultRetainClosed)
	if err != nil {
		t.Fatal(err)
	}
	want := resolvedCounts(ctx, t, old, before)
	if n, err := old.ArchiveNow(ctx); err != nil || n != 2 {
		t.Fatalf("archive: %d moved, %v; want 2", n, err)
	}
	if n, err := old.ArchiveNow(ctx); err != nil || n != 0 {
		t.Fatalf("archive again: %d moved, %v; want none", n, err)
	}
	if l, a := tableRows(ctx, t, old); l != 1 || a != 2 {
		t.Fatalf("%d rows in holds, %d in holds_closed; want 1 and 2", l, a)
	}
	checkArchivedCounts(ctx, t, old)
	if in := memHolds(old, sold.ID, released.ID, live.ID); in[sold.ID] || in[released.ID] || !in[live.ID] {
		t.Fatalf("after archiving: in memory %v, want only %s", in, live.ID)
	}
	if got := resolvedCounts(ctx, t, old, old.state.Load()); !sameCounts(got, want) {
		t.Errorf("the leader's counts after archiving:\n%v\nwant (a load before it)\n%v", got, want)
	}
	r := takeOverFrom(t, old, 2)
	m := r.state.Load()
	if !m.lazy["s"] || len(m.holds) != 1 || m.rows != 1 {
		t.Fatalf("after takeover: sale lazy %v, %d holds in memory, %d rows; want lazy, 1 and 1", m.lazy["s"], len(m.holds), m.rows)
	}
	// The last batch only archived: the new leader's stamps still rise above it.
	var archivedStamp int64
	if err := r.pool.QueryRow(ctx, `SELECT max(archived) FROM holds_closed`).Scan(&archivedStamp); err != nil || m.changed < archivedStamp {
		t.Fatalf("the new leader's stamp %d, the archive's %d (%v): want at least as high", m.changed, archivedStamp, err)
	}
	// ann has 6 bought (archived) and 1 held of a limit of 10: her archived row is read.
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 4, RequestKey: "k3"}); !errors.Is(err, ErrLimitExceeded) {
		t.Errorf("ann over her limit after takeover: %v, want ErrLimitExceeded", err)
	}
	if got := resolvedCounts(ctx, t, r, r.state.Load()); !sameCounts(got, want) {
		t.Errorf("a takeover after archiving:\n%v\nwant (a load before it)\n%v", got, want)
	}
	checkRetiredAnswers(t, r, ctx, sold, released)
	if err := checkPoolBooks(ctx, r); err != nil {
		t.Fatal(err)
	}
	books, err := ReadBooks(ctx, r.pool, "us", "s")
	if err != nil || len(books.Pools) != 1 || books.Pools[0].SoldInHolds != 6 || books.Pools[0].Sold != 6 || books.Pools[0].HeldInHolds != 1 {
		t.Fatalf("books after archiving: %+v, %v; want 6 sold in holds and pool, 1 held", books.Pools, err)
	}
}

// checkArchivedCounts compares archived_users and archived_pools with sums over holds_closed.
func checkArchivedCounts(ctx context.Context, t *testing.T, r *Region) {
	t.Helper()
	var bad int
	err := r.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM (SELECT sale_id, user_id, sku, count(*) AS n, coalesce(sum(quantity) FILTER (WHERE state = 'sold'), 0) AS s
			FROM holds_closed GROUP BY 1, 2, 3) c FULL JOIN archived_users a USING (sale_id, user_id, sku)
			WHERE a.holds IS DISTINCT FROM c.n OR a.sold IS DISTINCT FROM c.s) +
		(SELECT count(*) FROM (SELECT sale_id, sku, count(*) AS n, coalesce(sum(quantity) FILTER (WHERE state = 'sold'), 0) AS s
			FROM holds_closed GROUP BY 1, 2) c FULL JOIN archived_pools a USING (sale_id, sku)
			WHERE a.holds IS DISTINCT FROM c.n OR a.sold IS DISTINCT FROM c.s)`).Scan(&bad)
	if err != nil || bad != 0 {
		t.Fatalf("archived counts: %d rows differ from holds_closed (%v)", bad, err)
	}
}

// TestArchivedHoldsAnswered: every request about an archived hold is answered as it was while
// the hold was in holds: a reserve retry gets the hold back (also with the pool empty, on
// the path without the writer), a reuse of its key ALREADY_EXISTS, GetReservation reads it,
// a confirm of a sold one with its payment is idempotent, of an expired one says expired
// (refund), and a release of an expired one returns it unchanged.
func TestArchivedHoldsAnswered(t *testing.T) {
	r, ctx := newInternalRegion(t) // 10 units, limit 10, TTL 1m
	clk := r.cfg.Clock.(*clock.Manual)
	sold, expired := mustReserveIn(t, r, ctx, "ann", "k1", 2), mustReserveIn(t, r, ctx, "bob", "k1", 1)
	if _, err := r.Confirm(ctx, sold.ID, "pay-1"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	if n, err := r.SweepNow(ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	clk.Advance(DefaultRetainClosed + time.Second)
	if n, err := r.ArchiveNow(ctx); err != nil || n != 2 {
		t.Fatalf("archive: %d moved, %v; want 2", n, err)
	}
	r = takeOverFrom(t, r, 2) // a leader that has never seen the archived holds
	for _, h := range []Hold{sold, expired} {
		got, err := r.GetReservation(ctx, h.ID)
		if err != nil || got.ID != h.ID || got.User != h.User || got.State == Held {
			t.Errorf("GetReservation of archived %s: %+v, %v", h.ID, got, err)
		}
	}
	res, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 2, RequestKey: "k1"})
	if err != nil || !res.Replayed || res.Hold.ID != sold.ID || res.Hold.State != Sold || res.Hold.PaymentID != "pay-1" {
		t.Errorf("retry of an archived hold's reserve: %+v, %v", res, err)
	}
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 3, RequestKey: "k1"}); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("an archived hold's key reused: %v, want ErrAlreadyExists", err)
	}
	if c, err := r.Confirm(ctx, sold.ID, "pay-1"); err != nil || !c.Sold || c.Hold.State != Sold {
		t.Errorf("confirm of an archived sold hold, same payment: %+v, %v; want sold (idempotent)", c, err)
	}
	if c, err := r.Confirm(ctx, expired.ID, "pay-2"); err != nil || c.Sold || !strings.Contains(c.Reason, "expired") {
		t.Errorf("confirm of an archived expired hold: %+v, %v; want a refund saying expired", c, err)
	}
	if h, err := r.Release(ctx, expired.ID); err != nil || h.State != Expired {
		t.Errorf("release of an archived expired hold: %+v, %v", h, err)
	}
	mustReserveIn(t, r, ctx, "zed", "k1", 8) // the pool (10, 2 sold) is empty from here on
	res, err = r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "bob", Quantity: 1, RequestKey: "k1"})
	if err != nil || !res.Replayed || res.Hold.ID != expired.ID || res.Hold.State != Expired {
		t.Errorf("retry of an archived hold's reserve, pool empty: %+v, %v", res, err)
	}
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "bob", Quantity: 1, RequestKey: "k2"}); !errors.Is(err, ErrRegionExhausted) {
		t.Errorf("a new key with the pool empty: %v, want ErrRegionExhausted", err)
	}
	if err := checkPoolBooks(ctx, r); err != nil {
		t.Fatal(err)
	}
}

// TestArchivedKeysCountTowardTheCap: a buyer's archived request keys still count toward
// MaxKeysPerUser after a takeover that read none of them, and a new hold for a buyer whose
// holds are all archived is granted against the archived bought units (I2).
func TestArchivedKeysCountTowardTheCap(t *testing.T) {
	old, ctx := newInternalRegion(t)
	if _, err := old.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t2", Sale: "s", SKU: "x", Units: 10}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		h := mustReserveIn(t, old, ctx, "ann", fmt.Sprintf("k%d", i), 1)
		if _, err := old.Confirm(ctx, h.ID, "pay-"+h.ID); err != nil {
			t.Fatal(err)
		}
	}
	old.cfg.Clock.(*clock.Manual).Advance(DefaultRetainClosed + time.Second)
	if n, err := old.ArchiveNow(ctx); err != nil || n != 3 {
		t.Fatalf("archive: %d, %v", n, err)
	}
	old.Close()
	r, err := New(Config{Name: "us", Clock: old.cfg.Clock, Sweep: SweepConfig{Interval: time.Hour}, MaxKeysPerUser: 4, Logger: old.cfg.Logger}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Lead(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 8, RequestKey: "k3"}); !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("3 archived bought + 8 of a limit of 10: %v, want ErrLimitExceeded", err)
	}
	mustReserveIn(t, r, ctx, "ann", "k3", 6) // the fourth key
	if _, err := r.Reserve(ctx, ReserveRequest{Sale: "s", SKU: "x", User: "ann", Quantity: 1, RequestKey: "k4"}); !errors.Is(err, apierr.ErrTooManyKeys) {
		t.Fatalf("a fifth key for a buyer with a cap of 4 (3 of them archived): %v, want TOO_MANY_KEYS", err)
	}
}

// TestKeyFilterNoFalseNegatives: every digest added to the filter is found, whatever was added
// after it, its memory stays the same however many are added, and digests never added are
// found about as rarely as falsePositive says.
func TestKeyFilterNoFalseNegatives(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	var f keyFilter
	if f.has(rng.Uint64()) || f.bits != nil {
		t.Fatal("an empty filter finds a digest, or takes memory")
	}
	var added []uint64
	for _, n := range []int{1, 1000, 100_000, 1_000_000} {
		for len(added) < n {
			d := rng.Uint64()
			f.add(d)
			added = append(added, d)
		}
		for _, d := range added {
			if !f.has(d) {
				t.Fatalf("digest %x added but not found after %d added", d, n)
			}
		}
		if len(f.bits) != keyFilterWords || cap(f.bits) != keyFilterWords {
			t.Fatalf("%d words after %d added, want %d", len(f.bits), n, keyFilterWords)
		}
	}
	fp := 0
	const probes = 200_000
	for range probes {
		if f.has(rng.Uint64()) {
			fp++
		}
	}
	if got, want := float64(fp)/probes, f.falsePositive(); got > 3*want+0.0001 {
		t.Errorf("false positives %.6f at %d keys, want about %.6f", got, len(added), want)
	}
}

// TestWarmStandbyFollowsArchiving: two standbys, one loaded before anything was archived and
// one after (its sale lazy), refreshed between rounds of reserves, payments, releases,
// expiries and archiving (holds made, closed and archived between two refreshes among them),
// take over from their copies one after the other; each copy's counts equal a full load's
// once every buyer is resolved, its rows are the rows of holds, and the books stay clean.
func TestWarmStandbyFollowsArchiving(t *testing.T) {
	old, ctx := newInternalRegion(t)
	if _, err := old.Credit(ctx, CreditRequest{Generation: 1, TransferID: "t2", Sale: "s", SKU: "x", Units: 5000}); err != nil {
		t.Fatal(err)
	}
	early := newStandby(t, old)
	var late *Region
	rng := rand.New(rand.NewPCG(3, 4))
	var live []Hold
	for round := range 10 {
		live = archivingRound(ctx, t, old, rng, round, live)
		if round == 3 {
			late = newStandby(t, old)
		}
		if round%3 != 1 { // some rounds are caught up only at the next refresh
			early.refreshWarm(ctx)
			if late != nil {
				late.refreshWarm(ctx)
			}
		}
	}
	if !late.warm.lazy["s"] || early.warm.lazy["s"] {
		t.Fatalf("sale lazy in the early copy %v, in the late one %v; want only the late one", early.warm.lazy["s"], late.warm.lazy["s"])
	}
	checkWarmTakeover(ctx, t, old, early, 2)
	archivingRound(ctx, t, early, rng, 11, live) // round 11: archives
	late.refreshWarm(ctx)
	checkWarmTakeover(ctx, t, early, late, 3)
}

// archivingRound reserves 30 holds at r, closes all but 20 of the live ones, and in some
// rounds expires, passes the retention and archives.
func archivingRound(ctx context.Context, t *testing.T, r *Region, rng *rand.Rand, round int, live []Hold) []Hold {
	t.Helper()
	for i := range 30 {
		live = append(live, mustReserveIn(t, r, ctx, fmt.Sprintf("u%02d", rng.IntN(40)), fmt.Sprintf("r%d-%d", round, i), 1))
	}
	rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	for len(live) > 20 {
		h := live[len(live)-1]
		live = live[:len(live)-1]
		var err error
		if rng.IntN(2) == 0 {
			_, err = r.Confirm(ctx, h.ID, "pay-"+h.ID)
		} else {
			_, err = r.Release(ctx, h.ID)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	clk := r.cfg.Clock.(*clock.Manual)
	switch round % 3 {
	case 0: // what is still held expires
		clk.Advance(2 * time.Minute)
		if _, err := r.SweepNow(ctx); err != nil {
			t.Fatal(err)
		}
		live = live[:0]
	case 2: // what closed so far is past the retention, and archived
		clk.Advance(DefaultRetainClosed)
		if n, err := r.ArchiveNow(ctx); err != nil || n == 0 {
			t.Fatalf("archive in round %d: %d moved, %v", round, n, err)
		}
	}
	return live
}

// checkWarmTakeover stops old and has sb take over at epoch from its copy, then compares the
// copy with a full load of the same snapshot and serves one reserve.
func checkWarmTakeover(ctx context.Context, t *testing.T, old, sb *Region, epoch int64) {
	t.Helper()
	old.Close()
	now := sb.cfg.Clock.Now()
	full, err := loadMem(ctx, old.pool, "us", now, DefaultRetainClosed)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Lead(ctx, epoch); err != nil {
		t.Fatal(err)
	}
	if w, f := sb.stats.warmTakeovers.Load(), sb.stats.fullTakeovers.Load(); w != 1 || f != 0 {
		t.Fatalf("takeovers: %d warm, %d full; want the warm copy used", w, f)
	}
	m := sb.state.Load()
	if l, _ := tableRows(ctx, t, sb); m.rows != int64(l) || full.rows != int64(l) {
		t.Fatalf("the copy counts %d rows, a full load %d; holds has %d", m.rows, full.rows, l)
	}
	if got, want := resolvedCounts(ctx, t, sb, m), resolvedCounts(ctx, t, sb, full); !sameCounts(got, want) {
		t.Fatalf("the copy's counts:\n%v\na full load's:\n%v", got, want)
	}
	mustReserveIn(t, sb, ctx, fmt.Sprintf("new%d", epoch), "k", 1)
	if err := checkPoolBooks(ctx, sb); err != nil {
		t.Fatal(err)
	}
	checkArchivedCounts(ctx, t, sb)
}

// TestSweeperArchives: the leader's sweeper moves closed holds past the retention to the
// archive on its own, and leaves in holds those closed within it (one released, one the
// sweeper itself expires, its deadline long past).
func TestSweeperArchives(t *testing.T) {
	old, ctx := newInternalRegion(t)
	sold, recent := mustReserveIn(t, old, ctx, "ann", "k1", 1), mustReserveIn(t, old, ctx, "bob", "k1", 1)
	live := mustReserveIn(t, old, ctx, "cat", "k1", 1)
	if _, err := old.Confirm(ctx, sold.ID, "pay-1"); err != nil {
		t.Fatal(err)
	}
	clk := old.cfg.Clock.(*clock.Manual)
	clk.Advance(DefaultRetainClosed + time.Second)
	if _, err := old.Release(ctx, recent.ID); err != nil {
		t.Fatal(err)
	}
	old.Close()
	r, err := New(Config{Name: "us", Clock: clk, Sweep: SweepConfig{Interval: 10 * time.Millisecond}, Logger: old.cfg.Logger}, old.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Lead(ctx, 2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, a := tableRows(ctx, t, r)
		if l == 2 && a == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows in holds, %d archived after 10 s of sweeps; want 2 (%s expired now, %s released within the retention) and 1 (%s)",
				l, a, live.ID, recent.ID, sold.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h, err := r.GetReservation(ctx, sold.ID); err != nil || h.State != Sold {
		t.Fatalf("the archived hold: %+v, %v", h, err)
	}
}
