package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCartCommands: `reserve --sku phone=1,case=1` reserves a cart (one hold per line, the
// same cart id), a retry with its key replays it, `confirm --cart` sells every line and a
// line's own confirm is refused; `release --cart` gives another cart back whole; a cart that
// cannot be held whole names the refused line's SKU and holds nothing.
func TestCartCommands(t *testing.T) {
	d := startDev(t, "us")
	coord := "--coordinator=" + d.Coordinator.Addr()
	must := func(args ...string) string { t.Helper(); return mustRun(t, append([]string{coord}, args...)...) }
	must("sale", "create", "--sale", "s", "--sku", "phone=10", "--sku", "case=1", "--allocate", "us=1")
	reserve := func(user, key, skus string) (cartJSON, string, error) {
		out, err := run(t, coord, "reserve", "--region", "us", "--sale", "s", "--sku", skus, "--user", user, "--request-key", key, "-o", "json")
		var c cartJSON
		if err == nil {
			err = json.Unmarshal([]byte(out), &c)
		}
		return c, out, err
	}
	c, out, err := reserve("alice", "c1", "phone=1,case=1")
	if err != nil || len(c.Holds) != 2 || c.CartID != c.Holds[0].HoldID || c.Holds[1].CartID != c.CartID || c.Holds[1].SKU != "case" {
		t.Fatalf("reserve a cart: %v\n%s", err, out)
	}
	if again, out, err := reserve("alice", "c1", "phone=1,case=1"); err != nil || !again.Replayed || again.CartID != c.CartID {
		t.Errorf("the cart's retry: %v\n%s; want it replayed", err, out)
	}
	if _, out, err := reserve("bob", "c1", "phone=1,case=1"); err == nil || !strings.Contains(describe(err)+out, "case") {
		t.Errorf("a cart whose case is gone: %v\n%s; want refused naming the case", describe(err), out)
	}
	if out, err := run(t, coord, "confirm", "--region", "us", "--hold", c.Holds[1].HoldID, "--payment", "p0"); err == nil {
		t.Errorf("confirm of a cart's line alone: %s; want refused", out)
	}
	var conf cartJSON
	if err := json.Unmarshal([]byte(must("confirm", "--region", "us", "--cart", c.CartID, "--payment", "p1", "-o", "json")), &conf); err != nil ||
		conf.Outcome != "sold" || len(conf.Holds) != 2 || conf.Holds[0].State != "sold" || conf.Holds[1].State != "sold" {
		t.Errorf("confirm --cart: %+v %v; want both lines sold", conf, err)
	}
	other, out, err := reserve("carol", "c2", "phone=2")
	if err != nil {
		t.Fatalf("a cart of one line: %v\n%s", err, out)
	}
	if out := must("release", "--region", "us", "--cart", other.CartID); !strings.Contains(out, "released") {
		t.Errorf("release --cart:\n%s", out)
	}
}
