package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestBadInputOverGRPC sends malformed and impossible requests to a region and the
// coordinator and checks each gets a clear error with the right code, the field named,
// and that nothing was written.
func TestBadInputOverGRPC(t *testing.T) {
	d := startDev(t, "us", "eu", "ap")
	ctx := context.Background()
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale(t, coord, "good", 100, 2, time.Minute)
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: "later", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 10}},
		PerUserLimit: 2, HoldTtlMs: 60000, OpensAt: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "later", RequestId: "a-later",
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	us := quotav1.NewRegionServiceClient(dial(t, d.Regions[0].Addr(), trust.Storefront))
	before := auditOK(t, coord, "good")
	long := strings.Repeat("x", 10*1024)
	ok := func(mut func(r *quotav1.ReserveRequest)) *quotav1.ReserveRequest {
		r := &quotav1.ReserveRequest{SaleId: "good", Sku: "phone", UserId: "u1", Quantity: 1, RequestKey: "k1"}
		mut(r)
		return r
	}
	cases := []struct {
		name  string
		req   *quotav1.ReserveRequest
		code  codes.Code
		field string
	}{
		{"zero quantity", ok(func(r *quotav1.ReserveRequest) { r.Quantity = 0 }), codes.InvalidArgument, "quantity"},
		{"negative quantity", ok(func(r *quotav1.ReserveRequest) { r.Quantity = -1 }), codes.InvalidArgument, "quantity"},
		{"over the limit", ok(func(r *quotav1.ReserveRequest) { r.Quantity = 3 }), codes.InvalidArgument, "quantity"},
		{"empty sale", ok(func(r *quotav1.ReserveRequest) { r.SaleId = "" }), codes.InvalidArgument, "sale_id"},
		{"10KB sale", ok(func(r *quotav1.ReserveRequest) { r.SaleId = long }), codes.InvalidArgument, "sale_id"},
		{"empty user", ok(func(r *quotav1.ReserveRequest) { r.UserId = "" }), codes.InvalidArgument, "user_id"},
		{"10KB user", ok(func(r *quotav1.ReserveRequest) { r.UserId = long }), codes.InvalidArgument, "user_id"},
		{"empty key", ok(func(r *quotav1.ReserveRequest) { r.RequestKey = "" }), codes.InvalidArgument, "request_key"},
		{"10KB key", ok(func(r *quotav1.ReserveRequest) { r.RequestKey = long }), codes.InvalidArgument, "request_key"},
		{"unknown sale", ok(func(r *quotav1.ReserveRequest) { r.SaleId = "nope" }), codes.NotFound, ""},
		{"unknown sku", ok(func(r *quotav1.ReserveRequest) { r.Sku = "tablet" }), codes.NotFound, ""},
		{"before opening", ok(func(r *quotav1.ReserveRequest) { r.SaleId = "later" }), codes.FailedPrecondition, ""},
	}
	for _, c := range cases {
		_, err := us.Reserve(ctx, c.req)
		if status.Code(err) != c.code {
			t.Errorf("%s: got %v, want %s", c.name, err, c.code)
			continue
		}
		if c.field != "" && apierr.Field(err) != c.field {
			t.Errorf("%s: field %q, want %q (%v)", c.name, apierr.Field(err), c.field, err)
		}
		if apierr.Reason(err) == "" {
			t.Errorf("%s: no machine-readable reason in %v", c.name, err)
		}
	}
	if _, err := us.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: "us.0000000000000000000000000000", PaymentId: "p"}); status.Code(err) != codes.NotFound {
		t.Errorf("confirm of unknown hold: %v", err)
	}
	if _, err := us.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: "", PaymentId: "p"}); apierr.Field(err) != "hold_id" {
		t.Errorf("confirm with empty hold id: %v", err)
	}
	if _, err := us.Release(ctx, &quotav1.ReleaseRequest{HoldId: "eu.123"}); status.Code(err) != codes.NotFound {
		t.Errorf("release of another region's hold: %v", err)
	}
	if _, err := us.Release(ctx, &quotav1.ReleaseRequest{HoldId: "us.zzzz"}); apierr.Field(err) != "hold_id" {
		t.Errorf("release of a malformed hold id: %v; want invalid hold_id", err)
	}
	badSales := []*quotav1.CreateSaleRequest{
		{SaleId: "", Skus: []*quotav1.SkuTotal{{Sku: "p", Total: 1}}, PerUserLimit: 1, HoldTtlMs: 60000},
		{SaleId: "x", PerUserLimit: 1, HoldTtlMs: 60000},
		{SaleId: "x", Skus: []*quotav1.SkuTotal{{Sku: "p", Total: 0}}, PerUserLimit: 1, HoldTtlMs: 60000},
		{SaleId: "x", Skus: []*quotav1.SkuTotal{{Sku: "p", Total: 1}}, PerUserLimit: 0, HoldTtlMs: 60000},
		{SaleId: "x", Skus: []*quotav1.SkuTotal{{Sku: "p", Total: 1}}, PerUserLimit: 1, HoldTtlMs: 0},
		{SaleId: "good", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 999}}, PerUserLimit: 2, HoldTtlMs: 60000},
	}
	for _, r := range badSales {
		if _, err := coord.CreateSale(ctx, r); err == nil || apierr.Reason(err) == "" {
			t.Errorf("CreateSale(%v) = %v; want a typed error", r, err)
		}
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "good", RequestId: "alloc-good",
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("allocation id reused with other weights: %v", err)
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: "good", RequestId: "a2",
		Weights: []*quotav1.RegionWeight{{Region: "mars", Weight: 1}}}); apierr.Field(err) != "weights" {
		t.Errorf("allocation to unknown region: %v", err)
	}
	after := auditOK(t, coord, "good")
	if after.GetAvailable() != before.GetAvailable() || after.GetHeld() != 0 || after.GetTotal() != 100 {
		t.Fatalf("bad input changed state: before %v after %v", before, after)
	}
}
