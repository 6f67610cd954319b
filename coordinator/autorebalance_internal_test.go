package coordinator

import (
	"testing"
	"time"

	"github.com/quotaworks/quota/transfer"
)

// A sale found idle waits maxIdleWait before its next plan; one with demand, a move or a
// transfer in flight is planned every round.
func TestIdleSalesArePlannedLessOften(t *testing.T) {
	now := time.Unix(1000, 0)
	st := &autoState{moved: map[skuKey]time.Time{}, idle: map[string]time.Time{}, idleRuns: map[string]int{}}
	quiet := SalePlan{SKUs: []SKUPlan{{Pools: []PoolPlan{{PoolDemand: transfer.PoolDemand{Pool: "us", Available: 5}}}}}}
	busy := SalePlan{SKUs: []SKUPlan{{Pools: []PoolPlan{{PoolDemand: transfer.PoolDemand{Pool: "us", Recent: 1}}}}}}
	moving := SalePlan{SKUs: []SKUPlan{{Moves: []transfer.Move{{From: "eu", To: "us", Units: 5}}}}}
	flying := SalePlan{SKUs: []SKUPlan{{InFlight: 1}}}
	for name, p := range map[string]SalePlan{"busy": busy, "moving": moving, "in flight": flying} {
		if idlePlan(p) {
			t.Errorf("%s plan counted idle", name)
		}
	}
	if !idlePlan(quiet) {
		t.Fatal("a plan without demand or moves is not idle")
	}
	var never time.Time
	st.planned("s", true, now, never, st.wakeCount("s"))
	st.planned("s", true, now, never, st.wakeCount("s")) // without a live change feed the wait does not grow
	if st.due("s", now.Add(maxIdleWait-time.Millisecond)) || !st.due("s", now.Add(maxIdleWait)) {
		t.Fatalf("an idle sale is due again after %s, not before", maxIdleWait)
	}
	st.planned("s", false, now, never, st.wakeCount("s"))
	if !st.due("s", now) {
		t.Fatal("a busy sale is not due every round")
	}
}

// While every source of changes listens, an idle sale's wait doubles up to maxIdleBackoff; a
// change of its stock or ledger (wake) makes it due at once, and a sale not yet open is due
// when it opens.
func TestIdleSalesWaitLongerWhileChangesAreTold(t *testing.T) {
	now := time.Unix(1000, 0)
	live := true
	st := &autoState{moved: map[skuKey]time.Time{}, idle: map[string]time.Time{}, idleRuns: map[string]int{}, live: func() bool { return live }}
	var never time.Time
	for i, want := range []time.Duration{2, 4, 8, 16, 30, 30} {
		st.planned("s", true, now, never, st.wakeCount("s")) // opened long ago
		wait := want * time.Second
		if st.due("s", now.Add(wait-time.Millisecond)) || !st.due("s", now.Add(wait)) {
			t.Fatalf("idle plan %d: due again after %s, not before", i+1, wait)
		}
	}
	st.wake("s")
	if !st.due("s", now) {
		t.Fatal("a woken sale is not due at once")
	}
	st.planned("s", true, now, never, st.wakeCount("s"))
	if !st.due("s", now.Add(maxIdleWait)) {
		t.Fatal("a woken sale's wait does not start again from maxIdleWait")
	}
	before := st.wakeCount("s") // a change comes in while the plan is read: the plan found it idle, but it is due
	st.wake("s")
	st.planned("s", true, now, never, before)
	if !st.due("s", now) {
		t.Fatal("a sale woken while its plan was read is not due at once")
	}
	st.planned("s", true, now, never, st.wakeCount("s"))
	opens := now.Add(700 * time.Millisecond)
	st.planned("t", true, now, opens, st.wakeCount("t"))
	if st.due("t", opens.Add(-time.Millisecond)) || !st.due("t", opens) {
		t.Fatal("a sale not yet open is not due when it opens")
	}
	for range 5 { // just opened: its first buyers are seen within maxIdleWait
		st.planned("t", true, opens, opens.Add(-time.Second), st.wakeCount("t"))
	}
	if !st.due("t", opens.Add(maxIdleWait)) {
		t.Fatal("a sale open for a second waits more than maxIdleWait")
	}
	live = false
	for range 5 {
		st.planned("u", true, now, never, st.wakeCount("u"))
	}
	if !st.due("u", now.Add(maxIdleWait)) {
		t.Fatalf("without a live change feed an idle sale waits more than %s", maxIdleWait)
	}
	st.wake("never planned") // counted only for sales a plan reads: nothing to keep
	st.wakeCount("gone")
	st.keepOnly([]string{"s"})
	if len(st.idle) != 1 || len(st.idleRuns) != 1 || len(st.wakes) != 1 {
		t.Fatalf("keepOnly kept %d idle marks, %d counts and %d wake counts, want 1 each", len(st.idle), len(st.idleRuns), len(st.wakes))
	}
}

func TestAutoRebalanceSettings(t *testing.T) {
	var a AutoRebalance
	if err := a.withDefaults(); err != nil || a.Every != DefaultRebalanceEvery || a.Policy.Window != DefaultRebalanceWindow ||
		a.Policy.Horizon != DefaultRebalanceHorizon || a.Policy.MinUnits != DefaultRebalanceMinUnits ||
		a.MaxInFlight != DefaultRebalanceMaxInFlight || a.Cooldown != DefaultRebalanceCooldown {
		t.Fatalf("defaults %+v, %v", a, err)
	}
	for _, bad := range []AutoRebalance{{Every: -1}, {Every: time.Millisecond}, {Cooldown: -1}, {MaxInFlight: 101}, {MaxInFlight: -1},
		{Policy: transfer.Policy{MinUnits: -1}}, {Policy: transfer.Policy{Window: -time.Second}}} {
		if err := bad.withDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	for _, m := range []RebalanceMode{"", RebalanceAuto, RebalanceManual} {
		if err := CheckRebalanceMode(m); err != nil {
			t.Errorf("mode %q refused: %v", m, err)
		}
	}
	if err := CheckRebalanceMode("sometimes"); err == nil {
		t.Error("mode sometimes accepted")
	}
}
