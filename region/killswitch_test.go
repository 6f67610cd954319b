package region_test

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pause sets whether sku (or, "", the whole sale testSale) admits new holds at e's region.
func (e *env) pause(gen int64, sku string, paused bool, version region.PauseVersion, reason string) region.PauseRecord {
	e.t.Helper()
	rec, err := e.r.SetPaused(e.ctx, region.PauseRequest{Generation: gen, Sale: testSale, SKU: sku, Paused: paused,
		Reason: reason, Version: version})
	if err != nil {
		e.t.Fatalf("set paused %q %v (version %d): %v", sku, paused, version, err)
	}
	return rec
}

// wantPaused asserts that a new hold of sku for user is refused PAUSED (FailedPrecondition,
// reason PAUSED on the wire) with a message naming what, and that nothing was taken.
func (e *env) wantPaused(sku, user, what string) {
	e.t.Helper()
	before := stock(e.t, e.r, testSale, sku)
	_, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: sku, User: user, Quantity: 1, RequestKey: "new-" + user})
	if !errors.Is(err, region.ErrPaused) || !strings.Contains(err.Error(), what) {
		e.t.Fatalf("reserve of paused %s: %v; want PAUSED naming %q", sku, err, what)
	}
	if st := apierr.ToStatus(err); status.Code(st) != codes.FailedPrecondition || apierr.Reason(st) != "PAUSED" {
		e.t.Fatalf("PAUSED on the wire: %v (reason %q); want FailedPrecondition, reason PAUSED", st, apierr.Reason(st))
	}
	if after := stock(e.t, e.r, testSale, sku); after != before {
		e.t.Fatalf("a refused reserve changed the pool: %+v, then %+v", before, after)
	}
}

// TestPauseStopsNewHoldsOnly: a paused SKU refuses new holds with PAUSED, naming the sale,
// the SKU and the reason, also where its pool is empty (answered without the writer), while
// the sale's other SKU sells, a retry of a granted reserve gets its hold back, and Confirm and
// Release of the holds made before go on. The pause survives a takeover; resuming restores
// sales.
func TestPauseStopsNewHoldsOnly(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5, testSKU, "sku2", "tiny"), 10)
	paid, released := e.mustReserve("ann", "k1", 1), e.mustReserve("bob", "k1", 2)
	for i := range 10 { // empty the tiny pool
		if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: "tiny", User: "t" + strconv.Itoa(i), Quantity: 1, RequestKey: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if rec := e.pause(1, testSKU, true, 1, "price error"); !rec.Paused || rec.Version != 1 {
		t.Fatalf("pause: record %+v; want paused at version 1", rec)
	}
	e.pause(1, "tiny", true, 2, "")
	e.wantPaused(testSKU, "cat", "price error")
	e.wantPaused("tiny", "cat", "sku tiny of sale "+testSale)
	if _, err := e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: "sku2", User: "cat", Quantity: 1, RequestKey: "k2"}); err != nil {
		t.Fatalf("reserve of the sale's other SKU while one is paused: %v", err)
	}
	if res, err := e.reserve("ann", "k1", 1); err != nil || !res.Replayed || res.Hold.ID != paid.ID {
		t.Fatalf("retry of a reserve granted before the pause: %+v, %v; want its hold replayed", res, err)
	}
	if res, err := e.r.Confirm(e.ctx, paid.ID, "pay-1"); err != nil || !res.Sold {
		t.Fatalf("confirm while paused: %+v, %v; want sold", res, err)
	}
	if h, err := e.r.Release(e.ctx, released.ID); err != nil || h.State != region.Released {
		t.Fatalf("release while paused: %+v, %v; want released", h, err)
	}
	e.checkPool(testSale, testSKU, counts{avail: 9, held: 0, sold: 1})
	e.takeOver()
	e.wantPaused(testSKU, "dan", "price error")
	if rec := e.pause(1, testSKU, false, 3, ""); rec.Paused || rec.Version != 3 {
		t.Fatalf("resume: record %+v; want not paused at version 3", rec)
	}
	e.mustReserve("dan", "k1", 1)
	e.takeOver()
	e.mustReserve("eve", "k1", 1)
	e.checkPool(testSale, testSKU, counts{avail: 7, held: 2, sold: 1})
}

// TestPauseOfTheWholeSale: a sale paused without a SKU refuses every SKU of it, naming the
// sale; a SKU's own resume leaves it paused; the sale's resume restores every SKU.
func TestPauseOfTheWholeSale(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5, testSKU, "sku2"), 10)
	e.pause(1, "", true, 1, "fraud")
	e.wantPaused(testSKU, "ann", "sale "+testSale+" is paused (fraud)")
	e.wantPaused("sku2", "ann", "sale "+testSale+" is paused (fraud)")
	e.pause(1, testSKU, false, 2, "")
	e.wantPaused(testSKU, "ann", "fraud")
	e.pause(1, "", false, 3, "")
	e.mustReserve("ann", "k1", 1)
	if got := e.r.Paused(); len(got) != 0 {
		t.Fatalf("pauses after the resume: %v; want none", got)
	}
}

// TestPauseVersionsAndFences: a late retry of an older change (a lower version) does not
// undo a newer one and answers the record; a change of a deposed coordinator (a generation
// below one the sale has seen) is FENCED and changes nothing; malformed changes name their
// field; a pause that comes before the sale's terms holds once they do.
func TestPauseVersionsAndFences(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5), 10)
	e.pause(5, testSKU, true, 10, "")
	e.pause(5, testSKU, false, 12, "")
	if rec := e.pause(5, testSKU, true, 11, ""); rec.Paused || rec.Version != 12 {
		t.Fatalf("a late pause at version 11 after a resume at 12: record %+v; want not paused, version 12", rec)
	}
	e.mustReserve("ann", "k1", 1)
	_, err := e.r.SetPaused(e.ctx, region.PauseRequest{Generation: 4, Sale: testSale, SKU: testSKU, Paused: true, Version: 13})
	if !errors.Is(err, region.ErrFenced) {
		t.Fatalf("pause under generation 4 after 5: %v; want FENCED", err)
	}
	e.mustReserve("bob", "k1", 1)
	for field, req := range map[string]region.PauseRequest{
		"version": {Generation: 5, Sale: testSale, Paused: true},
		"sale_id": {Generation: 5, Sale: "bad sale", Paused: true, Version: 20},
		"sku":     {Generation: 5, Sale: testSale, SKU: "bad|sku", Paused: true, Version: 20},
		"reason":  {Generation: 5, Sale: testSale, Paused: true, Version: 20, Reason: strings.Repeat("x", 1025)},
	} {
		if _, err := e.r.SetPaused(e.ctx, req); fieldOf(err) != field {
			t.Errorf("%+v: %v; want INVALID_ARGUMENT on %s", req, err, field)
		}
	}
	later := region.SaleTerms{Sale: "later", SKUs: []string{testSKU}, PerUserLimit: 5, HoldTTL: testTTL, OpensAt: t0}
	if _, err := e.r.SetPaused(e.ctx, region.PauseRequest{Generation: 1, Sale: later.Sale, Paused: true, Version: 1}); err != nil {
		t.Fatalf("pause before the terms: %v", err)
	}
	e.sale(later, 3)
	_, err = e.r.Reserve(e.ctx, region.ReserveRequest{Sale: later.Sale, SKU: testSKU, User: "ann", Quantity: 1, RequestKey: "k"})
	if !errors.Is(err, region.ErrPaused) {
		t.Fatalf("reserve of a sale paused before its terms came: %v; want PAUSED", err)
	}
}

// TestPauseOfANewerGenerationWins: a pause change at the highest version (what a misused
// coordinator certificate could send at the current generation) holds against later
// versions of that generation, but a newer coordinator leader's change replaces it whatever
// its version, so no value of the version can switch the kill switch off for good.
func TestPauseOfANewerGenerationWins(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5), 10)
	e.pause(5, testSKU, false, math.MaxInt64, "foreign")
	if rec := e.pause(5, testSKU, true, 7, "fraud"); rec.Paused || rec.Version != math.MaxInt64 {
		t.Fatalf("a pause at the same generation under the foreign change: %+v; want the foreign record answered", rec)
	}
	if rec := e.pause(6, testSKU, true, 8, "fraud"); !rec.Paused || rec.Version != 8 {
		t.Fatalf("a pause of a newer generation: %+v; want it recorded", rec)
	}
	e.wantPaused(testSKU, "ann", testSKU)
}
