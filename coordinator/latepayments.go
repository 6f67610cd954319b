package coordinator

import (
	"context"
	"slices"
	"strings"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// MaxLatePayments bounds the late payments one call lists from each region.
const MaxLatePayments = 10000

// LatePaymentsReader lists up to limit of a region's late payments, of one sale or of every
// sale (region.ReadLatePayments).
type LatePaymentsReader func(ctx context.Context, sale string, limit int) ([]transfer.LatePayment, error)

// LatePaymentsReport is every region's late payments, oldest first.
type LatePaymentsReport struct {
	Payments []transfer.LatePayment
	// Truncated names the regions that have more than the limit asked for.
	Truncated []string
	// Unreadable are the regions whose database could not be read.
	Unreadable []RegionFailure
}

// LatePayments lists the payments every region received for a hold no longer live, which
// the storefront was told to refund (outcome REFUND): up to limit (1..MaxLatePayments) per
// region, of sale or of every sale, read from each region's database directly.
func (r Records) LatePayments(ctx context.Context, sale string, limit int) (LatePaymentsReport, error) {
	if sale != "" {
		if err := checkSaleID(sale); err != nil {
			return LatePaymentsReport{}, err
		}
	}
	if limit < 1 || limit > MaxLatePayments {
		return LatePaymentsReport{}, apierr.Invalid("limit", "must be 1..%d, got %d", MaxLatePayments, limit)
	}
	var rep LatePaymentsReport
	for _, link := range r.c.cfg.Regions {
		if link.LatePayments == nil {
			rep.Unreadable = append(rep.Unreadable, RegionFailure{Region: link.Name, Error: "no reader of its late payments"})
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, booksTimeout)
		ls, err := link.LatePayments(rctx, sale, limit+1)
		cancel()
		if err != nil {
			rep.Unreadable = append(rep.Unreadable, RegionFailure{Region: link.Name, Error: err.Error()})
			continue
		}
		if len(ls) > limit {
			ls, rep.Truncated = ls[:limit], append(rep.Truncated, link.Name)
		}
		rep.Payments = append(rep.Payments, ls...)
	}
	slices.SortStableFunc(rep.Payments, func(a, b transfer.LatePayment) int {
		if c := a.ReceivedAt.Compare(b.ReceivedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Region+a.HoldID, b.Region+b.HoldID)
	})
	return rep, nil
}
