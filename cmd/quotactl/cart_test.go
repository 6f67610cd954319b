package main

import (
	"encoding/json"
	"fmt"
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

// TestLoadCart: `load --cart phone=1,case=1` at a region with fewer cases than phones grants
// carts until the cases run out and refuses the rest whole, naming the case: no partial cart
// is left (held and sold phones equal held and sold cases) and the audit is clean. Each
// granted cart is two holds; the carts are paid or cancelled whole. Bad --cart input is
// refused before any call, naming the flag.
func TestLoadCart(t *testing.T) {
	d := startDev(t, "us")
	coord := "--coordinator=" + d.Coordinator.Addr()
	for args, want := range map[string]string{
		"--cart phone=1,case=1 --sku phone":            "--cart phone=1,case=1: a cart's lines come in place of --sku",
		"--cart phone":                                 `--cart "phone": want name=number`,
		"--cart phone=1,phone=2":                       `--cart: "phone" given twice`,
		"--cart phone=0":                               "--cart phone=0: sku phone: quantity 0",
		"--buyers 5":                                   "--sku: required, unless --cart",
		"--cart phone=1 --http us=https://127.0.0.1:1": "--cart: carts are reserved over gRPC",
	} {
		out, err := run(t, append([]string{coord, "load", "--sale", "s", "--skew", "us=1"}, strings.Fields(args)...)...)
		if exitCode(err) != 2 || !strings.Contains(describe(err), want) {
			t.Errorf("load %s: exit %d (%v)\n%s; want 2 and %q", args, exitCode(err), describe(err), out, want)
		}
	}
	mustRun(t, coord, "sale", "create", "--sale", "s", "--sku", "phone=40", "--sku", "case=12", "--allocate", "us=1")
	const buyers = 40
	out := mustRun(t, coord, "load", "--sale", "s", "--cart", "phone=1,case=1", "--buyers", fmt.Sprint(buyers), "--concurrency", "8",
		"--skew", "us=1", "--confirm", "0.6", "--release", "0.2", "-o", "json")
	var load loadJSON
	if err := json.Unmarshal([]byte(out), &load); err != nil || load.Carts == nil || load.CartsRefused == nil {
		t.Fatalf("load --cart -o json: %v\n%s", err, out)
	}
	carts, refused := *load.Carts, *load.CartsRefused
	if carts < 12 || refused == 0 || carts+refused != buyers || load.Granted != 2*carts || load.UnitsGranted != 2*carts || load.Failed != 0 {
		t.Errorf("load --cart: %d carts granted, %d refused, %d holds, %d units, %d failed; want at least the 12 cases' carts, "+
			"the rest refused, two holds a cart\n%s", carts, refused, load.Granted, load.UnitsGranted, load.Failed, out)
	}
	if n := load.SoldOut + load.Exhausted; n != refused || len(load.CartRefusals) != 1 || load.CartRefusals["case"] == nil {
		t.Errorf("refusals %v (%d sold out, %d exhausted); want every refused cart counted by its reason, naming the case\n%s",
			load.CartRefusals, load.SoldOut, load.Exhausted, out)
	}
	if load.Confirmed+load.Refunded+load.Released+load.Abandoned != carts {
		t.Errorf("carts settled: %d paid, %d refunded, %d released, %d abandoned; want the %d carts, each once",
			load.Confirmed, load.Refunded, load.Released, load.Abandoned, carts)
	}
	var rep auditJSON
	out, err := run(t, coord, "audit", "--sale", "s", "-o", "json")
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || len(rep.SKUs) != 2 {
		t.Fatalf("audit after load --cart: %v\n%s; want it clean", describe(err), out)
	}
	taken := map[string]int64{}
	for _, k := range rep.SKUs {
		taken[k.SKU] = k.Held + k.Sold
	}
	if taken["phone"] != taken["case"] || taken["case"] == 0 {
		t.Errorf("held+sold: %v; want as many phones as cases (no partial cart)", taken)
	}
	t.Logf("%d carts granted, %d refused %v; held+sold %v", carts, refused, load.CartRefusals, taken)
	// Later buyers take the cases the first load's released carts gave back, if any, and then
	// find every case taken: the text names the line that refused them.
	free := 12 - taken["case"]
	out = mustRun(t, coord, "load", "--sale", "s", "--cart", "phone=1,case=1", "--buyers", fmt.Sprint(free+3), "--concurrency", "3",
		"--skew", "us=1", "--seed", "2")
	want := fmt.Sprintf("carts: %d granted (%d holds, one per line), 3 refused whole (by the line refused: case: 3 ", free, 2*free)
	if !strings.Contains(out, want) {
		t.Errorf("load --cart when the cases are gone (%d left by released carts):\n%s\nwant %q", free, out, want)
	}
}
