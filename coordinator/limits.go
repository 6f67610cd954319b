package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// The per-user limit audited from the records: every buyer's units of every SKU (held, sold,
// archived sold) read from every region's database and summed, against the sale's per-user
// limit in the ledger. A region enforces the limit on what it holds; the binding of a buyer
// to one region (etcd) is what keeps the sum across regions under it, and this audit is the
// check that it did.

// Bounds of a limits audit.
const (
	// MaxLimitBuyers bounds the buyer-and-SKU pairs one sale's limits audit keeps in memory.
	MaxLimitBuyers = 2_000_000
	// MaxOffenders bounds the offenders a report lists; Over counts them all.
	MaxOffenders = 1000
	// limitsTimeout bounds one region's read of a sale's buyers.
	limitsTimeout = time.Minute
)

// ErrTooManyBuyers is a sale with more buyer-and-SKU pairs than a limits audit keeps.
var ErrTooManyBuyers = errors.New("too many buyers to audit at once")

// BuyerUnitsReader streams a region's buyers' units of a sale (region.ReadBuyerUnits).
type BuyerUnitsReader func(ctx context.Context, sale string, fn func(transfer.BuyerUnits) error) error

// Offender is a buyer above a sale's per-user limit across all regions.
type Offender struct {
	Sale, SKU, User string
	Limit, Units    transfer.Units
	// ByRegion is the buyer's units at each region that has some.
	ByRegion map[string]transfer.Units
	// Bound is the region the buyer's binding names in etcd ("" when none); BoundError why it
	// could not be read.
	Bound, BoundError string
}

// LimitsReport is the result of a limits audit.
type LimitsReport struct {
	OK bool
	At time.Time
	// Sales are the sales audited; Buyers how many buyer-and-SKU pairs were summed.
	Sales  []string
	Buyers int
	// Over counts the offenders; Offenders lists the first MaxOffenders.
	Over      int
	Offenders []Offender
	// Unreadable are the regions (and why) whose records could not be read: the limit is
	// then unproven.
	Unreadable []RegionFailure
}

type buyerKey struct{ sku, user string }

// AuditLimits checks, for one sale or every sale, that no buyer holds and bought more units
// of a SKU, summed over every region's records, than the sale's per-user limit.
func (r Records) AuditLimits(ctx context.Context, sale string) (LimitsReport, error) {
	if sale != "" {
		if err := checkSaleID(sale); err != nil {
			return LimitsReport{}, err
		}
	}
	limits, err := r.c.ledger.perUserLimits(ctx, sale)
	if err != nil {
		return LimitsReport{}, err
	}
	if sale != "" && len(limits) == 0 {
		return LimitsReport{}, apierr.NotFound("sale_id", sale)
	}
	rep := LimitsReport{OK: true}
	for _, s := range slices.Sorted(maps.Keys(limits)) {
		if err := r.c.auditSaleLimits(ctx, s, limits[s], &rep); err != nil {
			return LimitsReport{}, err
		}
	}
	rep.OK = rep.Over == 0 && len(rep.Unreadable) == 0
	rep.At = r.c.cfg.Clock.Now()
	return rep, nil
}

// perUserLimits is the per-user limit of sale, or of every sale.
func (l *ledger) perUserLimits(ctx context.Context, sale string) (map[string]transfer.Units, error) {
	rows, err := l.db.Query(ctx, `SELECT sale_id, per_user_limit FROM sales WHERE $1 = '' OR sale_id = $1`, sale)
	if err != nil {
		return nil, fmt.Errorf("read per-user limits: %w", err)
	}
	out := map[string]transfer.Units{}
	var s string
	var limit int64
	_, err = pgx.ForEachRow(rows, []any{&s, &limit}, func() error { out[s] = transfer.Units(limit); return nil })
	if err != nil {
		return nil, fmt.Errorf("read per-user limits: %w", err)
	}
	return out, nil
}

// auditSaleLimits sums one sale's buyers over every region and adds its offenders to rep.
func (c *Coordinator) auditSaleLimits(ctx context.Context, sale string, limit transfer.Units, rep *LimitsReport) error {
	rep.Sales = append(rep.Sales, sale)
	byBuyer := map[buyerKey]map[string]transfer.Units{}
	for _, r := range c.cfg.Regions {
		if r.BuyerUnits == nil {
			rep.Unreadable = append(rep.Unreadable, RegionFailure{Region: r.Name, Error: "no reader of its buyers' units"})
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, limitsTimeout)
		err := r.BuyerUnits(rctx, sale, func(b transfer.BuyerUnits) error {
			k := buyerKey{b.SKU, b.User}
			if byBuyer[k] == nil {
				if len(byBuyer) >= MaxLimitBuyers {
					return fmt.Errorf("sale %s has over %d buyer-and-SKU pairs: %w", sale, MaxLimitBuyers, ErrTooManyBuyers)
				}
				byBuyer[k] = map[string]transfer.Units{}
			}
			byBuyer[k][r.Name] += b.Units
			return nil
		})
		cancel()
		if errors.Is(err, ErrTooManyBuyers) {
			return err
		}
		if err != nil {
			rep.Unreadable = append(rep.Unreadable, RegionFailure{Region: r.Name, Error: fmt.Sprintf("sale %s: %v", sale, err)})
		}
	}
	rep.Buyers += len(byBuyer)
	var over []Offender
	for k, regions := range byBuyer {
		var sum transfer.Units
		for _, u := range regions {
			sum += u
		}
		if sum > limit {
			over = append(over, Offender{Sale: sale, SKU: k.sku, User: k.user, Limit: limit, Units: sum, ByRegion: regions})
		}
	}
	slices.SortFunc(over, func(a, b Offender) int { return strings.Compare(a.SKU+"\x00"+a.User, b.SKU+"\x00"+b.User) })
	rep.Over += len(over)
	for _, o := range over[:min(len(over), max(0, MaxOffenders-len(rep.Offenders)))] {
		rep.Offenders = append(rep.Offenders, c.withBinding(ctx, o))
	}
	return nil
}

// withBinding adds the region the offender's binding names, as etcd holds it.
func (c *Coordinator) withBinding(ctx context.Context, o Offender) Offender {
	if c.cfg.Bindings.Bound == nil {
		o.BoundError = "the coordinator does not read bindings"
		return o
	}
	bctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	region, ok, err := c.cfg.Bindings.Bound(bctx, o.Sale, o.User)
	switch {
	case err != nil:
		o.BoundError = err.Error()
	case ok:
		o.Bound = region
	}
	return o
}
