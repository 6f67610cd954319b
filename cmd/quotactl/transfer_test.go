package main

import (
	"encoding/json"
	"testing"
)

// TestTransferCommandReportsUnfinishedState: with the destination down, `quotactl transfer
// --wait` prints the transfer in its current state (pending: in flight) and exits 0, and
// `transfers list -o json` shows it with its age and reason; `transfers resolve` on it exits 1
// while the destination still does not answer.
func TestTransferCommandReportsUnfinishedState(t *testing.T) {
	d := startDev(t, "us", "eu")
	coord := "--coordinator=" + d.Coordinator.Addr()
	if out, err := run(t, coord, "sale", "create", "--sale", "s", "--sku", "phone=100", "--allocate", "us=1,eu=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	d.Regions[1].Close() // eu is gone: its process stops answering
	out, err := run(t, coord, "transfer", "--sale", "s", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "10",
		"--request-key", "move-1", "--wait", "1s", "-o", "json")
	if err != nil {
		t.Fatalf("transfer to a dead region: %v (want its state, not an error)\n%s", err, out)
	}
	var tr xferJSON
	if err := json.Unmarshal([]byte(out), &tr); err != nil || tr.State != "pending" || tr.ID == "" || tr.Generation <= 0 {
		t.Fatalf("transfer output %q (%v); want state pending with an id and a generation", out, err)
	}
	out, err = run(t, coord, "transfers", "list", "--sale", "s", "--unfinished", "-o", "json")
	var list struct {
		Transfers []xferJSON `json:"transfers"`
	}
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.Transfers) != 1 || list.Transfers[0].ID != tr.ID ||
		list.Transfers[0].Age == "" {
		t.Fatalf("transfers list: %v\n%s", err, out)
	}
	if out, err := run(t, coord, "transfers", "resolve", tr.ID, "-o", "json"); err == nil {
		t.Fatalf("resolve while the destination is down succeeded:\n%s", out)
	}
	if out, err := run(t, coord, "transfers", "resolve"); err == nil {
		t.Fatalf("resolve without an id: %s", out)
	}
}
