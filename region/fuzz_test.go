package region_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/proto"
)

// FuzzReserveRequest decodes arbitrary bytes as a ReserveRequest, as the gRPC server would,
// and validates it: no input panics, every refusal names a field, and every accepted request
// has ids and a quantity within bounds.
func FuzzReserveRequest(f *testing.F) {
	for _, r := range []*quotav1.ReserveRequest{
		{SaleId: "s", Sku: "phone", UserId: "u", Quantity: 1, RequestKey: "k"},
		{SaleId: "", Sku: "phone", UserId: "u", Quantity: 1, RequestKey: "k"},
		{SaleId: "s", Sku: "p", UserId: strings.Repeat("x", 200), Quantity: -3, RequestKey: "k"},
		{SaleId: "s/1", Sku: "a.b", UserId: "user@example.com", Quantity: 1 << 50, RequestKey: "k=1"},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var msg quotav1.ReserveRequest
		if proto.Unmarshal(data, &msg) != nil {
			return
		}
		req := region.ReserveRequest{Sale: msg.GetSaleId(), SKU: msg.GetSku(), User: msg.GetUserId(),
			Quantity: transfer.Units(msg.GetQuantity()), RequestKey: msg.GetRequestKey()}
		err := region.CheckReserve(req)
		if err != nil {
			var inv *apierr.InvalidError
			if !errors.As(err, &inv) || inv.Field == "" {
				t.Fatalf("refusal without a field: %v", err)
			}
			return
		}
		for _, id := range []string{req.Sale, req.SKU, req.User, req.RequestKey} {
			if id == "" || len(id) > transfer.MaxIDLen || strings.ContainsAny(id, " |\x00\n") {
				t.Fatalf("accepted a bad id %q", id)
			}
		}
		if req.Quantity <= 0 || req.Quantity > transfer.MaxUnits {
			t.Fatalf("accepted quantity %d", req.Quantity)
		}
	})
}
