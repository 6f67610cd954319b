package main

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/pgutil"
)

// TestAuditLimitsFindsABuyerOverTheLimit: a buyer reserves the limit of 2 at us; a hold of
// one more unit planted in eu's database makes 3 across the regions, which audit --limits
// reports (units per region, exit 1) where it found the sale clean before.
func TestAuditLimitsFindsABuyerOverTheLimit(t *testing.T) {
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	coord := "--coordinator=" + d.Coordinator.Addr()
	if out, err := run(t, coord, "sale", "create", "--sale", "s", "--sku", "phone=100", "--allocate", "us=1,eu=1", "--per-user-limit", "2"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	if out, err := run(t, coord, "reserve", "--region", "us", "--sale", "s", "--sku", "phone", "--user", "u1", "--quantity", "2", "--request-key", "k1"); err != nil {
		t.Fatalf("reserve: %v\n%s", err, out)
	}
	if out, err := run(t, coord, "audit", "--limits", "--sale", "s", "-o", "json"); err != nil {
		t.Fatalf("audit --limits of a buyer at the limit: %v\n%s", err, out)
	}
	db, err := pgutil.Open(ctx, d.DBURLs["eu"], 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state,
		created_at, expires_at, closed_at, payment_id) VALUES ('planted', 's', 'phone', 'u1', 1, 'planted', 'x', 'sold', now(), now(), now(), 'p')`); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, coord, "audit", "--limits", "--sale", "s", "-o", "json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("audit --limits with a planted unit: err %v; want exit status 1\n%s", err, out)
	}
	var rep limitsJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("audit --limits -o json: %v\n%s", err, out)
	}
	if rep.OK || rep.Over != 1 || len(rep.Offenders) != 1 {
		t.Fatalf("report %+v; want one offender", rep)
	}
	o := rep.Offenders[0]
	if o.User != "u1" || o.SKU != "phone" || o.Units != 3 || o.Limit != 2 || o.ByRegion["us"] != 2 || o.ByRegion["eu"] != 1 {
		t.Fatalf("offender %+v; want u1 with 3 units of phone (us 2, eu 1) under a limit of 2", o)
	}
	text, _ := run(t, coord, "audit", "--limits")
	t.Logf("%s", text)
}

// TestLatePaymentsAreListed: a Confirm after the hold expired is answered REFUND and
// recorded at the region; payments late lists it with its hold and the reason.
func TestLatePaymentsAreListed(t *testing.T) {
	d := startDev(t, "us", "eu")
	coord := "--coordinator=" + d.Coordinator.Addr()
	if out, err := run(t, coord, "sale", "create", "--sale", "s", "--sku", "phone=10", "--allocate", "us=1,eu=1", "--hold-ttl", "1s"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	if out, err := run(t, coord, "payments", "late", "--sale", "s"); err != nil {
		t.Fatalf("payments late with none: %v\n%s", err, out)
	}
	out, err := run(t, coord, "reserve", "--region", "eu", "--sale", "s", "--sku", "phone", "--user", "u1", "--request-key", "k1", "-o", "json")
	if err != nil {
		t.Fatalf("reserve: %v\n%s", err, out)
	}
	var h holdJSON
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("reserve -o json: %v\n%s", err, out)
	}
	time.Sleep(1500 * time.Millisecond)
	if out, err := run(t, coord, "confirm", "--region", "eu", "--hold", h.HoldID, "--payment", "pay-1"); err != nil {
		t.Fatalf("late confirm: %v\n%s", err, out)
	}
	out, err = run(t, coord, "payments", "late", "--sale", "s", "-o", "json")
	if err != nil {
		t.Fatalf("payments late: %v\n%s", err, out)
	}
	var late latePaymentsJSON
	if err := json.Unmarshal([]byte(out), &late); err != nil {
		t.Fatalf("payments late -o json: %v\n%s", err, out)
	}
	if len(late.Payments) != 1 {
		t.Fatalf("late payments %+v; want the one", late)
	}
	p := late.Payments[0]
	if p.Region != "eu" || p.HoldID != h.HoldID || p.PaymentID != "pay-1" || p.HoldState != "expired" || p.User != "u1" ||
		p.Sale != "s" || p.SKU != "phone" || p.Quantity != 1 || p.Reason == "" {
		t.Fatalf("late payment %+v; want pay-1 of hold %s at eu, expired", p, h.HoldID)
	}
	if out, err := run(t, coord, "payments", "late", "--sale", "other", "-o", "json"); err != nil || json.Unmarshal([]byte(out), &late) != nil || len(late.Payments) != 0 {
		t.Fatalf("payments late of another sale: %v %+v\n%s", err, late, out)
	}
}
