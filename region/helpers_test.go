package region_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// t0 is the start of every test's manual clock: whole seconds, so nothing depends on how
// PostgreSQL rounds sub-microsecond times.
var t0 = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

const (
	testSale = "sale1"
	testSKU  = "sku1"
	testTTL  = 10 * time.Minute
)

// quietLogger drops the regions' operational messages.
var quietLogger = slog.New(slog.DiscardHandler)

// env is one test's database, clock and leading region.
type env struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	clk   *clock.Manual
	r     *region.Region
	epoch int64 // e.r's
	opts  []func(*region.Config)
}

// newEnv creates a fresh migrated database and a region "us" leading it with epoch 1.
func newEnv(t *testing.T, opts ...func(*region.Config)) *env {
	t.Helper()
	ctx := context.Background()
	pool, _ := testpg.NewPool(t, "region", 20)
	if err := region.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	e := &env{t: t, ctx: ctx, pool: pool, clk: clock.NewManual(t0), opts: opts, epoch: 1}
	e.r = e.newRegion(1)
	return e
}

// takeOver closes the leading region and makes a new one lead with the next epoch: it loads
// everything from SQL, as a standby taking over after a crash would.
func (e *env) takeOver() {
	e.t.Helper()
	e.r.Close()
	e.epoch++
	e.r = e.newRegion(e.epoch)
}

// newRegion builds another region "us" on the env's database and clock and makes it lead
// with epoch.
func (e *env) newRegion(epoch int64) *region.Region {
	e.t.Helper()
	cfg := region.Config{Name: "us", Clock: e.clk, Sweep: region.SweepConfig{Interval: time.Hour}, Logger: quietLogger, Verify: os.Getenv("QUOTA_VERIFY") == "1"}
	for _, o := range e.opts {
		o(&cfg)
	}
	r, err := region.New(cfg, e.pool)
	if err != nil {
		e.t.Fatalf("new region: %v", err)
	}
	e.t.Cleanup(r.Close)
	if err := r.Lead(e.ctx, epoch); err != nil {
		e.t.Fatalf("lead with epoch %d: %v", epoch, err)
	}
	return r
}

func defaultTerms(sale string, limit transfer.Units, skus ...string) region.SaleTerms {
	if len(skus) == 0 {
		skus = []string{testSKU}
	}
	return region.SaleTerms{Sale: sale, SKUs: skus, PerUserLimit: limit, HoldTTL: testTTL, OpensAt: t0.Add(-time.Hour)}
}

// sale records terms (generation 1) and credits units of each of its SKUs.
func (e *env) sale(terms region.SaleTerms, units transfer.Units) {
	e.t.Helper()
	if err := e.r.PutSale(e.ctx, 1, terms); err != nil {
		e.t.Fatalf("put sale %s: %v", terms.Sale, err)
	}
	for _, sku := range terms.SKUs {
		st, err := e.r.Credit(e.ctx, region.CreditRequest{Generation: 1, TransferID: "t-" + terms.Sale + "-" + sku,
			Sale: terms.Sale, SKU: sku, Units: units})
		if err != nil || st != transfer.InCredited {
			e.t.Fatalf("credit %s/%s: %v, %v", terms.Sale, sku, st, err)
		}
	}
}

func (e *env) reserve(user, key string, q transfer.Units) (region.ReserveResult, error) {
	return e.r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: user, Quantity: q, RequestKey: key})
}

func (e *env) mustReserve(user, key string, q transfer.Units) region.Hold {
	e.t.Helper()
	res, err := e.reserve(user, key, q)
	if err != nil {
		e.t.Fatalf("reserve %s/%s x%d: %v", user, key, q, err)
	}
	return res.Hold
}

// counts is a pool's (available, held, sold).
type counts struct{ avail, held, sold transfer.Units }

func (c counts) String() string {
	return fmt.Sprintf("avail=%d held=%d sold=%d", c.avail, c.held, c.sold)
}

// stock returns one pool's counters through Region.Stock.
func stock(t testing.TB, r *region.Region, sale, sku string) region.PoolCounts {
	t.Helper()
	ps, err := r.Stock(context.Background(), sale)
	if err != nil {
		t.Fatalf("stock %s: %v", sale, err)
	}
	for _, p := range ps {
		if p.SKU == sku {
			return p
		}
	}
	t.Fatalf("stock %s: no pool for sku %s in %+v", sale, sku, ps)
	return region.PoolCounts{}
}

// checkPool asserts one pool's counters (through Stock) and the region's books for sale.
func (e *env) checkPool(sale, sku string, want counts) {
	e.t.Helper()
	p := stock(e.t, e.r, sale, sku)
	if got := (counts{p.Available, p.Held, p.Sold}); got != want {
		e.t.Errorf("pool %s/%s: %s, want %s", sale, sku, got, want)
	}
	if err := checkBooks(e.ctx, e.pool, sale); err != nil {
		e.t.Error(err)
	}
}

// checkBooks reads the region's books of sale and checks I2, I3 and that the pool counters
// equal the sums over the hold rows and over the per-user counts.
func checkBooks(ctx context.Context, pool *pgxpool.Pool, sale string) error {
	books, err := region.ReadBooks(ctx, pool, "us", sale)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range books.Pools {
		if p.Available < 0 || p.Held < 0 || p.Sold < 0 {
			errs = append(errs, fmt.Errorf("I2: pool %s/%s has a negative count: %+v", sale, p.SKU, p))
		}
		if p.HeldInHolds != p.Held {
			errs = append(errs, fmt.Errorf("pool %s/%s: held %d, but held holds sum to %d", sale, p.SKU, p.Held, p.HeldInHolds))
		}
		if p.SoldInHolds != p.Sold {
			errs = append(errs, fmt.Errorf("pool %s/%s: sold %d, but sold holds sum to %d", sale, p.SKU, p.Sold, p.SoldInHolds))
		}
		if p.CreditedIn-p.DebitedOut != p.Available+p.Held+p.Sold {
			errs = append(errs, fmt.Errorf("I3: pool %s/%s: credited %d - debited %d != available %d + held %d + sold %d",
				sale, p.SKU, p.CreditedIn, p.DebitedOut, p.Available, p.Held, p.Sold))
		}
		// credited_in counts inbound credits and restores of outbound transfers;
		// debited_out counts every outbound transfer that was debited.
		var credited, debited int64
		for _, rec := range books.Inbound {
			if rec.SKU == p.SKU && rec.State == transfer.InCredited {
				credited += int64(rec.Units)
			}
		}
		for _, rec := range books.Outbound {
			if rec.SKU == p.SKU && rec.State == transfer.OutVoided {
				credited += int64(rec.Units)
			}
			if rec.SKU == p.SKU && rec.State.Debited() {
				debited += int64(rec.Units)
			}
		}
		if transfer.Units(credited) != p.CreditedIn || transfer.Units(debited) != p.DebitedOut {
			errs = append(errs, fmt.Errorf("pool %s/%s: credited_in %d, debited_out %d, but the transfer records sum to %d and %d",
				sale, p.SKU, p.CreditedIn, p.DebitedOut, credited, debited))
		}
	}
	return errors.Join(errs...)
}

// count runs a SELECT count(*) query.
func count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// fieldOf returns the field an invalid-argument error names, or "" when err is not one.
func fieldOf(err error) string {
	var inv *apierr.InvalidError
	if errors.As(err, &inv) {
		return inv.Field
	}
	return ""
}

// errClass names the outcome class of err, for comparisons against a model.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, apierr.ErrInvalid):
		return "invalid:" + fieldOf(err)
	case errors.Is(err, region.ErrRegionExhausted):
		return "exhausted"
	case errors.Is(err, region.ErrLimitExceeded):
		return "limit"
	case errors.Is(err, region.ErrAlreadyExists):
		return "exists"
	case errors.Is(err, region.ErrNotFound):
		return "notfound"
	case errors.Is(err, region.ErrConflict):
		return "conflict"
	case errors.Is(err, region.ErrNotOpen):
		return "notopen"
	case errors.Is(err, region.ErrFenced):
		return "fenced"
	case errors.Is(err, region.ErrNotLeader):
		return "notleader"
	}
	return "other:" + err.Error()
}
