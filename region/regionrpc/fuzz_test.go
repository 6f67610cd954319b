package regionrpc_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/proto"
)

// FuzzReserveRequest decodes arbitrary bytes as a ReserveRequest, as this package's server does,
// and validates it: no input panics, every refusal names a field, and every accepted request
// has ids and a quantity within bounds.
func FuzzReserveRequest(f *testing.F) {
	for _, r := range []*quotav1.ReserveRequest{
		{SaleId: "s", Sku: "phone", UserId: "u", Quantity: 1, RequestKey: "k"},
		{SaleId: "", Sku: "phone", UserId: "u", Quantity: 1, RequestKey: "k"},
		{SaleId: "s", Sku: "p", UserId: strings.Repeat("x", 200), Quantity: -3, RequestKey: "k"},
		{SaleId: "s/1", Sku: "a.b", UserId: "user@example.com", Quantity: 1 << 50, RequestKey: "k=1"},
		{SaleId: "s", UserId: "u", RequestKey: "k", Lines: []*quotav1.CartLine{{Sku: "phone", Quantity: 1}, {Sku: "case", Quantity: 1}}},
		{SaleId: "s", UserId: "u", RequestKey: "k#1", Lines: []*quotav1.CartLine{{Sku: "phone", Quantity: 1}, {Sku: "phone", Quantity: 0}}},
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
		if len(msg.GetLines()) > 0 {
			checkFuzzedCart(t, &msg)
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

// checkFuzzedCart validates a decoded request with lines as a cart: a refusal names a field;
// an accepted cart has 1..MaxCartLines lines of valid, distinct SKUs and quantities within
// bounds, and a request key its lines' keys extend within transfer.MaxIDLen.
func checkFuzzedCart(t *testing.T, msg *quotav1.ReserveRequest) {
	req := region.CartRequest{Sale: msg.GetSaleId(), User: msg.GetUserId(), RequestKey: msg.GetRequestKey()}
	for _, l := range msg.GetLines() {
		req.Lines = append(req.Lines, region.CartLine{SKU: l.GetSku(), Quantity: transfer.Units(l.GetQuantity())})
	}
	if err := region.CheckCart(req); err != nil {
		var inv *apierr.InvalidError
		if !errors.As(err, &inv) || inv.Field == "" {
			t.Fatalf("refusal without a field: %v", err)
		}
		return
	}
	if n := len(req.Lines); n == 0 || n > region.MaxCartLines || len(req.RequestKey)+3 > transfer.MaxIDLen ||
		strings.Contains(req.RequestKey, "#") {
		t.Fatalf("accepted a cart of %d lines, key %q", n, req.RequestKey)
	}
	seen := map[string]bool{}
	for _, l := range req.Lines {
		if seen[l.SKU] || transfer.CheckID(l.SKU) != "" || l.Quantity <= 0 || l.Quantity > transfer.MaxUnits {
			t.Fatalf("accepted line %+v of %+v", l, req.Lines)
		}
		seen[l.SKU] = true
	}
}

// FuzzParticipantRequests decodes arbitrary bytes as each of the coordinator's requests, as
// the gRPC server would, and validates it as the region does before its writer: no input
// panics, every refusal names a field, and every accepted request has valid ids and units
// within bounds (a request that passed could not fail a batch on a constraint).
func FuzzParticipantRequests(f *testing.F) {
	seeds := []proto.Message{
		&quotav1.CreditRequest{Generation: 1, TransferId: "t1", SaleId: "s", Sku: "phone", Units: 10},
		&quotav1.RefuseRequest{Generation: 1, TransferId: "t1", SaleId: "s", Sku: "phone", Units: -1},
		&quotav1.DebitRequest{Generation: 9223372036854775807, TransferId: "t1", SaleId: "s", Sku: "phone", To: "eu", Units: 1 << 60},
		&quotav1.RestoreRequest{Generation: 1, TransferId: "", SaleId: "s"},
		&quotav1.PutSaleRequest{Generation: 1, Sale: &quotav1.SaleTerms{SaleId: "s", Skus: []string{"a", "a b"}, PerUserLimit: 2, HoldTtlMs: 60000}},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(i))
	}
	f.Fuzz(func(t *testing.T, data []byte, kind uint8) {
		err, ids, units, unitsMin, ok := decodeParticipant(data, kind%6)
		if !ok {
			return
		}
		if err != nil {
			var inv *apierr.InvalidError
			if !errors.As(err, &inv) || inv.Field == "" {
				t.Fatalf("refusal without a field: %v", err)
			}
			return
		}
		for _, id := range ids {
			if id == "" || len(id) > transfer.MaxIDLen || strings.ContainsAny(id, " |\x00\n") {
				t.Fatalf("accepted a bad id %q", id)
			}
		}
		if units < unitsMin || units > transfer.MaxUnits {
			t.Fatalf("accepted units %d", units)
		}
	})
}

// decodeParticipant decodes data as participant request kind and validates it; it returns
// the validation's answer, the request's ids, its units and their least valid value, and
// whether data decoded at all.
func decodeParticipant(data []byte, kind uint8) (err error, ids []string, units, unitsMin transfer.Units, ok bool) {
	switch kind {
	case 0, 1: // Credit, Refuse
		var m quotav1.CreditRequest
		if proto.Unmarshal(data, &m) != nil {
			return nil, nil, 0, 0, false
		}
		r := region.CreditRequest{Generation: m.GetGeneration(), TransferID: m.GetTransferId(), Sale: m.GetSaleId(), SKU: m.GetSku(), Units: transfer.Units(m.GetUnits())}
		return region.CheckCredit(r), []string{r.TransferID, r.Sale, r.SKU}, r.Units, 0, true
	case 2, 3: // Debit, RefuseDebit
		var m quotav1.DebitRequest
		if proto.Unmarshal(data, &m) != nil {
			return nil, nil, 0, 0, false
		}
		r := region.DebitRequest{Generation: m.GetGeneration(), TransferID: m.GetTransferId(), Sale: m.GetSaleId(), SKU: m.GetSku(), To: m.GetTo(), Units: transfer.Units(m.GetUnits())}
		return region.CheckDebit(r), []string{r.TransferID, r.Sale, r.SKU, r.To}, r.Units, 1, true
	case 4: // Restore, Settle
		var m quotav1.RestoreRequest
		if proto.Unmarshal(data, &m) != nil {
			return nil, nil, 0, 0, false
		}
		r := region.TransferRef{Generation: m.GetGeneration(), TransferID: m.GetTransferId(), Sale: m.GetSaleId()}
		return region.CheckTransferRef(r), []string{r.TransferID, r.Sale}, 0, 0, true
	default: // PutSale
		var m quotav1.PutSaleRequest
		if proto.Unmarshal(data, &m) != nil || m.GetSale() == nil {
			return nil, nil, 0, 0, false
		}
		s := m.GetSale()
		terms := region.SaleTerms{Sale: s.GetSaleId(), SKUs: s.GetSkus(), PerUserLimit: transfer.Units(s.GetPerUserLimit()),
			HoldTTL: time.Duration(s.GetHoldTtlMs()) * time.Millisecond}
		return region.CheckTerms(terms), append([]string{terms.Sale}, terms.SKUs...), terms.PerUserLimit, 1, true
	}
}
