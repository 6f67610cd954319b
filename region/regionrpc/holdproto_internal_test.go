package regionrpc

import (
	"testing"
	"time"

	"github.com/quotaworks/quota/region"
)

// TestHoldFromProtoKeepsCartID: an edge reads every hold back with HoldFromProto; a
// cart line's cart id must survive the round trip (the edge's GET /v1/holds/{id}, a buyer's
// holds and a cart's holds carry cart_id as the leader's own edge does).
func TestHoldFromProtoKeepsCartID(t *testing.T) {
	h := region.Hold{ID: "us.h1", Sale: "s", SKU: "phone", User: "u", Quantity: 1, RequestKey: "k#1", State: region.Held,
		ExpiresAt: time.Unix(100, 0).UTC(), Region: "us", CartID: "us.h0"}
	got, err := HoldFromProto(toProto(h))
	if err != nil {
		t.Fatal(err)
	}
	if got.CartID != h.CartID {
		t.Errorf("HoldFromProto(toProto(h)).CartID = %q; want %q", got.CartID, h.CartID)
	}
}
