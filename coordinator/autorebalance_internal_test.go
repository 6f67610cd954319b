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
	st := &autoState{moved: map[skuKey]time.Time{}, idle: map[string]time.Time{}}
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
	st.planned("s", true, now)
	if st.due("s", now.Add(maxIdleWait-time.Millisecond)) || !st.due("s", now.Add(maxIdleWait)) {
		t.Fatalf("an idle sale is due again after %s, not before", maxIdleWait)
	}
	st.planned("s", false, now)
	if !st.due("s", now) {
		t.Fatal("a busy sale is not due every round")
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
