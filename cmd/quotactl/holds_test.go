package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestHoldsList: `holds list` prints a buyer's holds at a region through ListBuyerHolds,
// newest first with their states, as a table and as JSON; --limit cuts and says so; a
// missing --user is bad usage naming it.
func TestHoldsList(t *testing.T) {
	d := startDev(t, "us")
	coord := "--coordinator=" + d.Coordinator.Addr()
	must := func(args ...string) string { t.Helper(); return mustRun(t, append([]string{coord}, args...)...) }
	must("sale", "create", "--sale", "s", "--sku", "phone=10", "--sku", "case=10", "--allocate", "us=1")
	var first, second holdJSON
	for _, r := range []struct {
		sku, key string
		into     *holdJSON
	}{{"phone", "k1", &first}, {"case", "k2", &second}} {
		if err := json.Unmarshal([]byte(must("reserve", "--region", "us", "--sale", "s", "--sku", r.sku, "--user", "alice", "--request-key", r.key, "-o", "json")), r.into); err != nil {
			t.Fatal(err)
		}
	}
	must("reserve", "--region", "us", "--sale", "s", "--sku", "phone", "--user", "bob", "--request-key", "k1")
	must("confirm", "--region", "us", "--hold", first.HoldID, "--payment", "pay-1")

	var list struct {
		Holds     []holdJSON `json:"holds"`
		Truncated bool       `json:"truncated"`
	}
	if err := json.Unmarshal([]byte(must("holds", "list", "--region", "us", "--sale", "s", "--user", "alice", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Holds) != 2 || list.Truncated || list.Holds[0].HoldID != second.HoldID || list.Holds[0].State != "held" ||
		list.Holds[1].HoldID != first.HoldID || list.Holds[1].State != "sold" || list.Holds[1].PaymentID != "pay-1" {
		t.Fatalf("alice's holds: %+v; want the case held, then the phone sold", list)
	}
	out := must("holds", "list", "--region", "us", "--sale", "s", "--user", "alice", "--limit", "1")
	if !strings.Contains(out, second.HoldID) || strings.Contains(out, first.HoldID) || !strings.Contains(out, "more holds than --limit 1") {
		t.Errorf("holds list --limit 1:\n%s; want the newest hold and a note that there are more", out)
	}
	if out, err := run(t, coord, "holds", "list", "--region", "us", "--sale", "s"); exitCode(err) != 2 || !strings.Contains(describe(err), "--user: required") {
		t.Errorf("holds list without --user: exit %d, %v\n%s; want bad usage naming --user", exitCode(err), describe(err), out)
	}
}
