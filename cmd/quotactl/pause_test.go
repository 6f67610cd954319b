package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSalePauseAndResume: `sale pause --sku` stops new holds of that SKU at every region
// (PAUSED, naming it and the reason) while the sale's other SKU sells and a hold made before
// is paid for; `sale show` and `audit` list the pause; `sale resume` restores sales. Unknown
// sales and SKUs are errors, a missing --sale is bad usage, and a pause that cannot reach a
// region prints what it did and exits 1 naming the region.
func TestSalePauseAndResume(t *testing.T) {
	d := startDev(t, "us", "eu")
	coord := "--coordinator=" + d.Coordinator.Addr()
	must := func(args ...string) string { t.Helper(); return mustRun(t, append([]string{coord}, args...)...) }
	must("sale", "create", "--sale", "s", "--sku", "phone=100", "--sku", "case=10", "--allocate", "us=1,eu=1")
	var held holdJSON
	if err := json.Unmarshal([]byte(must("reserve", "--region", "us", "--sale", "s", "--sku", "phone", "--user", "u1", "--request-key", "k1", "-o", "json")), &held); err != nil {
		t.Fatal(err)
	}
	var res pauseResultJSON
	if err := json.Unmarshal([]byte(must("sale", "pause", "--sale", "s", "--sku", "phone", "--reason", "price error", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Paused || strings.Join(res.Reached, ",") != "us,eu" || len(res.Unreached) != 0 || len(res.Pauses) != 1 ||
		res.Pauses[0].SKU != "phone" || res.Pauses[0].Reason != "price error" || len(res.Pauses[0].Undelivered) != 0 {
		t.Fatalf("pause: %+v; want phone paused for its reason at us and eu", res)
	}
	for _, r := range []string{"us", "eu"} {
		out, err := run(t, coord, "reserve", "--region", r, "--sale", "s", "--sku", "phone", "--user", "u2", "--request-key", "k2")
		if exitCode(err) != 1 || !strings.Contains(describe(err), "reason PAUSED") || !strings.Contains(err.Error(), "sku phone of sale s is paused (price error)") {
			t.Errorf("reserve of the paused SKU at %s: exit %d, %v\n%s; want PAUSED naming the SKU and the reason", r, exitCode(err), describe(err), out)
		}
	}
	must("reserve", "--region", "eu", "--sale", "s", "--sku", "case", "--user", "u2", "--request-key", "k3")
	must("confirm", "--region", "us", "--hold", held.HoldID, "--payment", "pay-1")
	if out := must("sale", "show", "--sale", "s"); !strings.Contains(out, "sku phone of sale s PAUSED since ") || !strings.Contains(out, ": price error") {
		t.Errorf("sale show while paused:\n%s; want the pause with its reason", out)
	}
	var a auditJSON
	if err := json.Unmarshal([]byte(must("audit", "--sale", "s", "-o", "json")), &a); err != nil {
		t.Fatal(err)
	}
	if !a.OK || len(a.Pauses) != 1 || a.Pauses[0].SKU != "phone" {
		t.Errorf("audit while paused: %+v; want ok, listing the pause", a)
	}
	if out := must("sale", "resume", "--sale", "s"); !strings.Contains(out, "sale s resumed in us, eu") || !strings.Contains(out, "nothing paused") {
		t.Errorf("resume:\n%s", out)
	}
	must("reserve", "--region", "eu", "--sale", "s", "--sku", "phone", "--user", "u2", "--request-key", "k2")
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"sale", "pause"}, 2, "--sale"},
		{[]string{"sale", "pause", "--sale", "nosuch"}, 1, "nosuch"},
		{[]string{"sale", "pause", "--sale", "s", "--sku", "nosuch"}, 1, "nosuch"},
		{[]string{"sale", "resume", "--sale", "s", "--sku", "bad sku"}, 1, "field sku"},
	} {
		if out, err := run(t, append([]string{coord}, tt.args...)...); exitCode(err) != tt.code || !strings.Contains(describe(err), tt.want) {
			t.Errorf("%v: exit %d, %v\n%s; want exit %d naming %s", tt.args, exitCode(err), describe(err), out, tt.code, tt.want)
		}
	}
	d.Regions[1].Crash()
	out, err := run(t, coord, "sale", "pause", "--sale", "s", "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("pause with eu down: %v\n%s", err, out)
	}
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "not every region has it yet: eu") || len(res.Unreached) != 1 ||
		res.Unreached[0].Region != "eu" || strings.Join(res.Pauses[0].Undelivered, ",") != "eu" {
		t.Fatalf("pause with eu down: exit %d, %v, %+v; want exit 1 naming eu, us reached", exitCode(err), err, res)
	}
}
