package regionhttp

import (
	"context"
	"net/http"

	"github.com/quotaworks/quota/region"
)

// RegionAPI is what the storefront routes ask of a region about holds: *region.Region, or a
// storefront edge that forwards each call to the region's leader (quotad edge).
type RegionAPI interface {
	Reserve(ctx context.Context, req region.ReserveRequest) (region.ReserveResult, error)
	GetReservation(ctx context.Context, holdID string) (region.Hold, error)
	BuyerHolds(ctx context.Context, sale, user string, limit int) ([]region.Hold, bool, error)
	Confirm(ctx context.Context, holdID, paymentID string) (region.ConfirmResult, error)
	Release(ctx context.Context, holdID string) (region.Hold, error)
}

// DoorAPI is what the storefront routes ask of a region's front door: *region.Door, or a
// storefront edge that answers polls from the lines the leader feeds it and forwards the
// rest (quotad edge).
type DoorAPI interface {
	Reserve(ctx context.Context, req region.ReserveRequest) (region.ReserveResult, error)
	Enter(ctx context.Context, sale, user, addr string) (region.Admission, error)
	GetAdmission(ctx context.Context, sale, id string) (region.Admission, error)
	JoinWaitlist(ctx context.Context, sale, user, sku string) (region.Admission, error)
	Describe(ctx context.Context, sale string) (region.SaleView, error)
}

// CartAPI is what the storefront routes ask of a region about carts: region.Carts, or a
// storefront edge that forwards each call to the region's leader (quotad edge).
type CartAPI interface {
	Reserve(ctx context.Context, req region.CartRequest) (region.CartResult, error)
	Get(ctx context.Context, cartID string) (region.CartCloseResult, error)
	Confirm(ctx context.Context, cartID, paymentID string) (region.CartCloseResult, error)
	Release(ctx context.Context, cartID string) (region.CartCloseResult, error)
}

// Serve is Handler over any region, front door and carts: the same routes, authorization
// and answers, whoever decides behind them. A nil d is a region without a front door.
func Serve(r RegionAPI, d DoorAPI, c CartAPI, opts Options) http.Handler {
	return handlerOf(r, d, c, opts)
}
