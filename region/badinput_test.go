package region_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// snapshot is everything a refused request must leave unchanged.
func snapshot(t *testing.T, e *env) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT coalesce(string_agg(sale_id||'/'||sku||':'||available||','||held||','||sold||','||credited_in||','||debited_out, ';' ORDER BY sale_id, sku), '') FROM pools`,
		`SELECT count(*)::text FROM holds`,
		`SELECT count(*)::text FROM late_payments`,
		`SELECT coalesce(string_agg(hold_id||':'||state, ';' ORDER BY hold_id), '') FROM holds`,
		`SELECT coalesce(string_agg(sale_id||':'||generation, ';' ORDER BY sale_id), '') FROM sale_fences`,
		`SELECT count(*)::text FROM sales`,
		`SELECT count(*)::text FROM transfers_in`,
	} {
		var s string
		if err := e.pool.QueryRow(e.ctx, q).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		b.WriteString(s + "\n")
	}
	return b.String()
}

func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5), 10)
	later := defaultTerms("later", 5)
	later.OpensAt = t0.Add(time.Hour)
	e.sale(later, 10)
	if err := e.r.PutSale(e.ctx, 1, defaultTerms("dry", 5)); err != nil { // a sale with no stock here
		t.Fatal(err)
	}
	h := e.mustReserve("alice", "k", 1)
	before := snapshot(t, e)

	long := strings.Repeat("x", 10<<10)
	ok := region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "bob", Quantity: 1, RequestKey: "k1"}
	with := func(f func(*region.ReserveRequest)) region.ReserveRequest { r := ok; f(&r); return r }
	reserves := []struct {
		name    string
		req     region.ReserveRequest
		field   string // the invalid field, or "" when wantErr applies
		wantErr error
	}{
		{"quantity 0", with(func(r *region.ReserveRequest) { r.Quantity = 0 }), "quantity", nil},
		{"quantity -1", with(func(r *region.ReserveRequest) { r.Quantity = -1 }), "quantity", nil},
		{"quantity over max", with(func(r *region.ReserveRequest) { r.Quantity = transfer.MaxUnits + 1 }), "quantity", nil},
		{"quantity over the user limit", with(func(r *region.ReserveRequest) { r.Quantity = 6 }), "quantity", nil},
		{"empty sale", with(func(r *region.ReserveRequest) { r.Sale = "" }), "sale_id", nil},
		{"10KB sale", with(func(r *region.ReserveRequest) { r.Sale = long }), "sale_id", nil},
		{"bad chars in sale", with(func(r *region.ReserveRequest) { r.Sale = "s'; DROP TABLE holds; --" }), "sale_id", nil},
		{"empty sku", with(func(r *region.ReserveRequest) { r.SKU = "" }), "sku", nil},
		{"10KB sku", with(func(r *region.ReserveRequest) { r.SKU = long }), "sku", nil},
		{"empty user", with(func(r *region.ReserveRequest) { r.User = "" }), "user_id", nil},
		{"10KB user", with(func(r *region.ReserveRequest) { r.User = long }), "user_id", nil},
		{"user with a NUL", with(func(r *region.ReserveRequest) { r.User = "bo\x00b" }), "user_id", nil},
		{"empty request key", with(func(r *region.ReserveRequest) { r.RequestKey = "" }), "request_key", nil},
		{"10KB request key", with(func(r *region.ReserveRequest) { r.RequestKey = long }), "request_key", nil},
		{"129-byte request key", with(func(r *region.ReserveRequest) { r.RequestKey = strings.Repeat("k", transfer.MaxIDLen+1) }), "request_key", nil},
		{"unknown sale", with(func(r *region.ReserveRequest) { r.Sale = "nosuch" }), "", region.ErrNotFound},
		{"unknown sku", with(func(r *region.ReserveRequest) { r.SKU = "nosuch" }), "", region.ErrNotFound},
		{"before opens_at", with(func(r *region.ReserveRequest) { r.Sale = "later" }), "", region.ErrNotOpen},
		{"no stock in this region", with(func(r *region.ReserveRequest) { r.Sale = "dry" }), "", region.ErrRegionExhausted},
	}
	for _, tc := range reserves {
		_, err := e.r.Reserve(e.ctx, tc.req)
		if tc.field != "" {
			if f := fieldOf(err); f != tc.field {
				t.Errorf("%s: %v (field %q), want invalid %s", tc.name, err, f, tc.field)
			}
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Errorf("%s: %v is not ErrInvalid", tc.name, err)
			}
		} else if !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.wantErr)
		}
	}
	holdOps := []struct {
		name    string
		id      string
		field   string
		wantErr error
	}{
		{"unknown hold", "us.0000000000000000000000000000", "", region.ErrNotFound},
		{"hold id of a made-up form", "us.abc", "hold_id", nil},
		{"hold id with upper-case hex", "us.0000000000000000000000000ABC", "hold_id", nil},
		{"hold of another region", "eu.abc", "", region.ErrNotFound},
		{"hold id without a region", "abc", "hold_id", nil},
		{"empty hold id", "", "hold_id", nil},
		{"10KB hold id", "us." + long, "hold_id", nil},
	}
	for _, tc := range holdOps {
		check := func(op string, err error) {
			t.Helper()
			if tc.field != "" {
				if f := fieldOf(err); f != tc.field {
					t.Errorf("%s %s: %v (field %q), want invalid %s", op, tc.name, err, f, tc.field)
				}
			} else if !errors.Is(err, tc.wantErr) {
				t.Errorf("%s %s: %v, want %v", op, tc.name, err, tc.wantErr)
			}
		}
		_, err := e.r.Confirm(e.ctx, tc.id, "pay")
		check("confirm", err)
		_, err = e.r.Release(e.ctx, tc.id)
		check("release", err)
		_, err = e.r.GetReservation(e.ctx, tc.id)
		check("get", err)
	}
	for _, p := range []string{"", long, "pay ment"} {
		if _, err := e.r.Confirm(e.ctx, h.ID, p); fieldOf(err) != "payment_id" {
			t.Errorf("confirm with payment %.20q: %v, want invalid payment_id", p, err)
		}
	}
	credits := []struct {
		name    string
		req     region.CreditRequest
		field   string
		wantErr error
	}{
		{"negative units", region.CreditRequest{Generation: 1, TransferID: "tx", Sale: testSale, SKU: testSKU, Units: -1}, "units", nil},
		{"units over max", region.CreditRequest{Generation: 1, TransferID: "tx", Sale: testSale, SKU: testSKU, Units: transfer.MaxUnits + 1}, "units", nil},
		{"empty transfer id", region.CreditRequest{Generation: 1, Sale: testSale, SKU: testSKU, Units: 1}, "transfer_id", nil},
		{"10KB sale", region.CreditRequest{Generation: 1, TransferID: "tx", Sale: long, SKU: testSKU, Units: 1}, "sale_id", nil},
		{"generation 0", region.CreditRequest{Generation: 0, TransferID: "tx", Sale: testSale, SKU: testSKU, Units: 1}, "", region.ErrFenced},
	}
	for _, tc := range credits {
		_, err := e.r.Credit(e.ctx, tc.req)
		if tc.field != "" {
			if f := fieldOf(err); f != tc.field {
				t.Errorf("credit %s: %v (field %q), want invalid %s", tc.name, err, f, tc.field)
			}
		} else if !errors.Is(err, tc.wantErr) {
			t.Errorf("credit %s: %v, want %v", tc.name, err, tc.wantErr)
		}
	}
	badTerms := []struct {
		name  string
		terms region.SaleTerms
		field string
	}{
		{"no skus", region.SaleTerms{Sale: "x", PerUserLimit: 1, HoldTTL: time.Minute}, "skus"},
		{"bad sale", region.SaleTerms{Sale: long, SKUs: []string{"a"}, PerUserLimit: 1, HoldTTL: time.Minute}, "sale_id"},
		{"bad sku", region.SaleTerms{Sale: "x", SKUs: []string{""}, PerUserLimit: 1, HoldTTL: time.Minute}, "sku"},
		{"zero limit", region.SaleTerms{Sale: "x", SKUs: []string{"a"}, PerUserLimit: 0, HoldTTL: time.Minute}, "per_user_limit"},
		{"short ttl", region.SaleTerms{Sale: "x", SKUs: []string{"a"}, PerUserLimit: 1, HoldTTL: time.Millisecond}, "hold_ttl"},
	}
	for _, tc := range badTerms {
		if err := e.r.PutSale(e.ctx, 1, tc.terms); fieldOf(err) != tc.field {
			t.Errorf("put sale %s: %v, want invalid %s", tc.name, err, tc.field)
		}
	}
	if _, err := e.r.Stock(e.ctx, "nosuch"); !errors.Is(err, region.ErrNotFound) {
		t.Errorf("stock of an unknown sale: %v, want ErrNotFound", err)
	}

	if after := snapshot(t, e); after != before {
		t.Errorf("refused requests changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	e.checkPool(testSale, testSKU, counts{9, 1, 0})
	e.checkPool("later", testSKU, counts{10, 0, 0})

	// The refusals were about the input, not a broken region: the same region still serves,
	// and the not-yet-open sale opens with the clock.
	e.clk.Advance(time.Hour)
	if _, err := e.r.Reserve(e.ctx, with(func(r *region.ReserveRequest) { r.Sale = "later" })); err != nil {
		t.Errorf("reserve once the sale opened: %v", err)
	}
	e.checkPool("later", testSKU, counts{9, 1, 0})
}

// TestCanceledContext: a request whose context is already canceled is either refused
// before it is queued (context.Canceled), or answered with an unknown outcome, or granted;
// never anything else, and asking again with the same key always settles on one hold.
func TestCanceledContext(t *testing.T) {
	const n = 20
	e := newEnv(t)
	e.sale(defaultTerms(testSale, n), 100)
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	ids := map[string]bool{}
	for i := range n {
		req := region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "u", Quantity: 1, RequestKey: fmt.Sprintf("k%d", i)}
		_, err := e.r.Reserve(ctx, req)
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, region.ErrUnknownOutcome) {
			t.Errorf("reserve %d with a canceled context: %v", i, err)
		}
		res, err := e.r.Reserve(e.ctx, req)
		if err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
		ids[res.Hold.ID] = true
	}
	if len(ids) != n {
		t.Errorf("%d distinct holds, want %d", len(ids), n)
	}
	if got := count(t, e.pool, `SELECT count(*) FROM holds`); got != n {
		t.Errorf("%d hold rows, want %d", got, n)
	}
	e.checkPool(testSale, testSKU, counts{100 - n, n, 0})
}
