package main

import (
	"strings"
	"testing"

	"github.com/quotaworks/quota/internal/apierr"
)

// TestBadInputChangesNothing: a mistyped --allocate is refused before the sale exists (a
// created sale's terms can no longer change); unknown regions and subcommands are usage
// errors; a region without the sale's stock is left out of stock, not an error; a load whose
// every reserve fails says why and fails.
func TestBadInputChangesNothing(t *testing.T) {
	d := startDev(t, "us", "eu")
	coord := "--coordinator=" + d.Coordinator.Addr()
	for _, alloc := range []string{"us", "us=1,xx=1", "us=-1", "us=0,eu=0", "us=1,us=2"} {
		out, err := run(t, coord, "sale", "create", "--sale", "typo", "--sku", "phone=5", "--allocate", alloc)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "--allocate") {
			t.Errorf("--allocate %q: exit %d, %v\n%s; want a usage error naming --allocate", alloc, exitCode(err), err, out)
		}
	}
	if out, err := run(t, coord, "sale", "show", "--sale", "typo"); err == nil {
		t.Fatalf("sale typo exists after refused creates:\n%s", out)
	}
	// Same terms, corrected --allocate: the sale is created and allocated to us alone.
	if out, err := run(t, coord, "sale", "create", "--sale", "typo", "--sku", "phone=5", "--allocate", "us=1"); err != nil {
		t.Fatalf("corrected create: %v\n%s", err, out)
	}
	// Run again with other weights: the sale exists and its allocation's request key is spent,
	// which the error says, with what to do instead.
	out, err := run(t, coord, "sale", "create", "--sale", "typo", "--sku", "phone=5", "--allocate", "us=1,eu=2")
	if exitCode(err) != 1 || strings.Contains(err.Error(), "created with its stock unallocated") ||
		!strings.Contains(err.Error(), "exists already") || !strings.Contains(err.Error(), "new --request-key") {
		t.Errorf("create again with other weights: exit %d (%v)\n%s; want 1, saying the sale exists and to pass a new --request-key", exitCode(err), err, out)
	}
	// Another sale under the spent request key: told to pick a new one, not to fix --allocate.
	out, err = run(t, coord, "sale", "create", "--sale", "typo4", "--sku", "phone=5", "--allocate", "us=1", "--request-key", "alloc-typo")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "new --request-key") || strings.Contains(err.Error(), "corrected --allocate") {
		t.Errorf("another sale under a spent allocation id: exit %d (%v)\n%s; want 1, telling to pass a new --request-key", exitCode(err), err, out)
	}
	out, err = run(t, coord, "sale", "create", "--sale", "typo", "--sku", "phone=5", "--allocate", "us=1,eu=2", "--request-key", "alloc-2")
	if err != nil || !strings.Contains(out, "moved nothing") {
		t.Errorf("a new allocation with nothing unallocated: %v\n%s; want exit 0 and a note that nothing moved", err, out)
	}
	if out, err := run(t, coord, "sale", "create", "--sale", "unalloc", "--sku", "phone=5", "-o", "json"); err != nil || !strings.Contains(out, `"allocated": {}`) {
		t.Errorf("a sale never allocated: %v\n%s; want \"allocated\": {} (not null)", err, out)
	}
	if _, err := run(t, coord, "sale", "create", "--sale", "typo2", "--sku", "phone=5", "--request-key", "alloc-x"); exitCode(err) != 2 {
		t.Errorf("--request-key without --allocate: exit %d (%v), want 2", exitCode(err), err)
	}
	out, err = run(t, coord, "stock", "--sale", "typo", "-o", "json")
	if err != nil || !strings.Contains(out, `"region": "us"`) || strings.Contains(out, `"region": "eu"`) {
		t.Errorf("stock of a sale only us holds: %v\n%s; want us's pool, eu left out, exit 0", err, out)
	}
	// eu got none of the stock but knows the sale: a buyer there is told to look elsewhere.
	if out, err := run(t, coord, "reserve", "--region", "eu", "--sale", "typo", "--sku", "phone", "--user", "u", "--request-key", "k"); err == nil ||
		!strings.Contains(describe(err), "REGION_EXHAUSTED") {
		t.Errorf("reserve at a region without stock of the sale: %v\n%s; want REGION_EXHAUSTED", describe(err), out)
	}
	if _, err := run(t, coord, "stock", "--sale", "typo", "--region", "zz"); exitCode(err) != 2 {
		t.Errorf("stock --region zz: exit %d (%v), want 2", exitCode(err), err)
	}
	if _, err := run(t, coord, "stock", "--sale", "nosuch"); exitCode(err) != 1 || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("stock of an unknown sale: exit %d (%v), want 1 naming the sale", exitCode(err), err)
	}
	for _, args := range [][]string{{"sale", "bogus"}, {"transfers", "bogus"}, {"stock", "--sale", "typo", "--timeout", "0"},
		{"transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1", "--wait", "-1s"},
		{"transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1", "--request-key", "bad id!"},
		{"transfers", "resolve", ""},
		{"transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1", "--request-key", ""},
		{"rebalance", "--sale", "typo", "--sku", "phone", "--request-key", ""},
		// Flags the help calls required, checked before any call.
		{"reserve", "--region", "us", "--sale", "typo", "--sku", "phone", "--user", "u"},
		{"confirm", "--region", "us", "--hold", "us.0123"},
		{"release", "--region", "us"},
		{"transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "eu"},
		{"transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "0"},
		{"sale", "create", "--sale", "typo3"},
		{"sale", "create", "--sale", "typo3", "--sku", "phone=-5"},
		{"rebalance", "--sale", "typo", "--sku", "phone", "--window", "0s"},
		{"rebalance", "--sale", "typo", "--sku", "phone", "--min-units", "-5"},
		{"load", "--sale", "typo", "--sku", "phone", "--buyers", "0"},
		{"load", "--sale", "typo", "--sku", "phone", "--confirm", "0.9", "--release", "0.2"}} {
		if _, err := run(t, append([]string{coord}, args...)...); exitCode(err) != 2 {
			t.Errorf("%v: exit %d (%v), want 2", args, exitCode(err), err)
		}
	}
	if _, err := run(t, coord, "transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "mars", "--units", "1"); exitCode(err) != 2 ||
		!strings.Contains(err.Error(), "--to \"mars\": unknown region; the coordinator knows us, eu") {
		t.Errorf("transfer --to mars: exit %d (%v); want 2, listing the known regions", exitCode(err), err)
	}
	if _, err := run(t, coord, "transfer", "--sale", "nosuch", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1"); exitCode(err) != 1 ||
		!strings.Contains(describe(err), `sale_id "nosuch": not found`) || !strings.Contains(describe(err), "NOT_FOUND") {
		t.Errorf("transfer in an unknown sale: exit %d (%v); want 1, NOT_FOUND naming sale_id", exitCode(err), describe(err))
	}
	if _, err := run(t, "--coordinator="+d.Regions[0].Addr(), "regions"); err == nil || !strings.Contains(err.Error(), "is it a region's address") {
		t.Errorf("--coordinator at a region: %v; want a hint that it is not the coordinator", err)
	}
	if _, err := run(t, "--coordinator=", "regions"); exitCode(err) != 2 {
		t.Errorf("--coordinator '': exit %d (%v), want 2", exitCode(err), err)
	}
	// A refused transfer recorded nothing: no request key is offered for a retry.
	out, err = run(t, coord, "transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "100000")
	if exitCode(err) != 1 || strings.Contains(out, "request key") || !strings.HasSuffix(describeFor(transferCmd(), err), "set by --units") {
		t.Errorf("transfer of more than us has: exit %d (%v)\n%s; want 1, no request key, the flag named", exitCode(err), err, out)
	}
	out, err = run(t, coord, "transfer", "--sale", "typo", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1")
	if err != nil || !strings.Contains(out, "request key manual-") {
		t.Errorf("transfer of 1 unit: %v\n%s; want the random request key printed", err, out)
	}
	// Refusing a transfer that is already posted cancels nothing, and says so.
	id := out[strings.Index(out, "transfer t-")+len("transfer "):]
	id = id[:strings.IndexAny(id, " :\n")]
	if out, err := run(t, coord, "transfers", "resolve", "--refuse", id); err != nil || !strings.Contains(out, "nothing left to cancel") {
		t.Errorf("resolve --refuse of posted %s: %v\n%s; want exit 0 and a note that it is posted", id, err, out)
	}
	if out, err := run(t, coord, "transfers", "list", "--sale", "bad sale!"); exitCode(err) != 1 || apierr.Field(err) != "sale_id" {
		t.Errorf("transfers list --sale 'bad sale!': exit %d (%v)\n%s; want 1, invalid sale_id", exitCode(err), err, out)
	}
	if out, err := run(t, coord, "transfers", "list", "--sale", "nosuch"); exitCode(err) != 1 || !strings.Contains(describe(err), "NOT_FOUND") {
		t.Errorf("transfers list --sale nosuch: exit %d (%v)\n%s; want 1, NOT_FOUND", exitCode(err), err, out)
	}
	if out, err := run(t, coord, "transfers", "list", "--sale", "typo"); err != nil || !strings.Contains(out, " typo ") {
		t.Errorf("transfers list --sale typo: %v\n%s; want its transfers, with a SALE column", err, out)
	}
	if _, err := run(t, coord, "release", "--region", "us", "--hold", "nosuch"); apierr.Field(err) != "hold_id" {
		t.Errorf("release of a malformed hold id: %v; want invalid hold_id", err)
	}
	// A rebalance retried under its request key replays what it moved, plans nothing new. eu
	// sells its one unit (and refused a buyer before it had any: demand too), so it needs more
	// and us gives them; us keeps at least 2.
	if out, err := run(t, coord, "reserve", "--region", "eu", "--sale", "typo", "--sku", "phone", "--user", "rb-u", "--request-key", "k"); err != nil {
		t.Fatalf("reserve at eu: %v\n%s", err, out)
	}
	var rb [2]string
	for i := range rb {
		out, err := run(t, coord, "rebalance", "--sale", "typo", "--sku", "phone", "--min-units", "1", "--window", "1m",
			"--horizon", "1m", "--request-key", "rb-typo", "-o", "json")
		if err != nil {
			t.Fatalf("rebalance %d: %v\n%s", i+1, err, out)
		}
		rb[i] = out
	}
	if !strings.Contains(rb[1], `"replayed": true`) || !strings.Contains(rb[0], `"replayed": false`) ||
		!strings.Contains(rb[0], `"state": "posted"`) || transferIDs(rb[0]) != transferIDs(rb[1]) {
		t.Errorf("rebalance twice under one request key:\n%s\n%s\nwant the second replayed", rb[0], rb[1])
	}
	// The same buyers twice: the second run's holds are the first run's, replayed, not new.
	for i, want := range []string{`"granted": 2`, `"replayed_from_earlier_run": 2`} {
		out, err := run(t, coord, "load", "--sale", "typo", "--sku", "phone", "--buyers", "2", "--concurrency", "2", "--skew", "us=1",
			"--seed", "9", "-o", "json")
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("load run %d of the same 2 buyers: %v\n%s; want %s", i+1, err, out, want)
		}
	}
	out, err = run(t, coord, "load", "--sale", "nosuch", "--sku", "phone", "--buyers", "5", "--concurrency", "5", "--skew", "us=1")
	if err == nil || !strings.Contains(err.Error(), "every reserve failed") || !strings.Contains(out, "first failure:") {
		t.Errorf("load of an unknown sale: %v\n%s; want it to fail with the first failure's reason", err, out)
	}
}

// transferIDs are the transfer ids in a JSON output, in order.
func transferIDs(out string) string {
	var ids []string
	for _, f := range strings.Split(out, `"transfer_id": "`)[1:] {
		ids = append(ids, f[:strings.Index(f, `"`)])
	}
	return strings.Join(ids, ",")
}
