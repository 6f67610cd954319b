package region_test

import (
	"testing"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// TestRefuseDebitTable: the source's side of cancelling a requested transfer, step by step,
// on the region and on its model (Core), which must answer alike. A refusal first leaves a
// tombstone that every later debit answers; a debit first is what a refusal then reports;
// the units move at most once (I5), and available + debited_out stays what was credited (I3).
func TestRefuseDebitTable(t *testing.T) {
	type step struct {
		refuse bool
		units  transfer.Units // 0: the transfer's own 30
		want   string         // an OutState, or an error class (errClass)
	}
	tests := []struct {
		name      string
		steps     []step
		available transfer.Units
	}{
		{"refused, then debit", []step{{true, 0, "refused"}, {false, 0, "refused"}, {true, 0, "refused"}}, 100},
		{"debited, then refuse", []step{{false, 0, "pending"}, {true, 0, "pending"}, {false, 0, "pending"}}, 70},
		{"refuse of other content", []step{{false, 0, "pending"}, {true, 31, "exists"}}, 70},
		{"refused, then debit of other content", []step{{true, 0, "refused"}, {false, 31, "exists"}, {false, 0, "refused"}}, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.sale(defaultTerms(testSale, 5), 100)
			core := region.NewCore("us")
			if err := core.PutSale(1, defaultTerms(testSale, 5)); err != nil {
				t.Fatal(err)
			}
			if _, err := core.Credit(region.CreditRequest{Generation: 1, TransferID: "t-" + testSale + "-" + testSKU, Sale: testSale, SKU: testSKU, Units: 100}); err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				req := region.DebitRequest{Generation: 1, TransferID: "t-out", Sale: testSale, SKU: testSKU, To: "eu", Units: 30}
				if s.units != 0 {
					req.Units = s.units
				}
				live, model := e.r.Debit, core.Debit
				if s.refuse {
					live, model = e.r.RefuseDebit, core.RefuseDebit
				}
				st, err := live(e.ctx, req)
				mst, merr := model(req)
				got, mgot := string(st), string(mst)
				if err != nil {
					got = errClass(err)
				}
				if merr != nil {
					mgot = errClass(merr)
				}
				if got != s.want || mgot != s.want {
					t.Fatalf("step %d (refuse %v): region %q (%v), model %q (%v); want %q", i, s.refuse, got, err, mgot, merr, s.want)
				}
			}
			p := stock(t, e.r, testSale, testSKU)
			if p.Available != tt.available || p.Available+p.DebitedOut != 100 {
				t.Fatalf("pool %+v; want available %d and available + debited_out = 100", p, tt.available)
			}
		})
	}
}
