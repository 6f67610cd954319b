package region

import (
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// Errors a caller can test with errors.Is.
var (
	ErrRegionExhausted = apierr.ErrRegionExhausted
	ErrSoldOut         = apierr.ErrSoldOut
	ErrLimitExceeded   = apierr.ErrLimitExceeded
	ErrAlreadyExists   = apierr.ErrAlreadyExists
	ErrNotFound        = apierr.ErrNotFound
	ErrNotOpen         = apierr.ErrNotOpen
	ErrNotLeader       = apierr.ErrNotLeader
	ErrFenced          = apierr.ErrFenced
	ErrConflict        = apierr.ErrConflict
	ErrUnknownOutcome  = apierr.ErrUnknownOutcome
	ErrAborted         = apierr.ErrAborted
	ErrPaused          = apierr.ErrPaused
	ErrTicketInvalid   = apierr.ErrTicketInvalid
	ErrTicketUsed      = apierr.ErrTicketUsed
)

// HoldState is where a hold is in its life: held, then exactly one of sold, released or
// expired (I5).
type HoldState string

// The hold states.
const (
	Held     HoldState = "held"
	Sold     HoldState = "sold"
	Released HoldState = "released"
	Expired  HoldState = "expired"
)

// Hold is one reservation.
type Hold struct {
	ID         string
	Region     string
	Sale       string
	SKU        string
	User       string
	Quantity   transfer.Units
	RequestKey string
	State      HoldState
	CreatedAt  time.Time
	ExpiresAt  time.Time
	PaymentID  string
	// Admission is the waiting room's admission whose ticket the hold was made with, or ""
	// in a sale without one. No two holds of a sale share one.
	Admission string
	// CartID is the cart the hold is a line of (its line 0's hold id), or "" for a hold
	// reserved alone (cart.go).
	CartID string
}

// SaleTerms are the rules of a sale as the coordinator published them to this region: the
// one definition, transfer.SaleTerms.
type SaleTerms = transfer.SaleTerms

// ReserveRequest asks for quantity units of sku for user, idempotent by RequestKey.
type ReserveRequest struct {
	Sale       string
	SKU        string
	User       string
	Quantity   transfer.Units
	RequestKey string
	// Ticket is the admission ticket, required in a sale with a waiting room; it backs at
	// most one RequestKey.
	Ticket string
	// Token, when set, is Ticket as its caller read it (admission.ParseToken): the region
	// verifies it instead of reading Ticket again. One that is not Ticket's is ignored.
	Token *admission.Token
	// fromAside is, for a waitlist offer's ticket, the units offered: the reservation may
	// take that many of the units set aside for the waitlist (set by the front door).
	fromAside transfer.Units
}

// ReserveResult is a granted reservation. Replayed is true when RequestKey matched an
// earlier identical request, whose hold (in its current state) is returned.
type ReserveResult struct {
	Hold     Hold
	Replayed bool
}

// ConfirmResult says whether the payment bought the hold (Sold) or must be refunded.
type ConfirmResult struct {
	Sold   bool
	Hold   Hold
	Reason string
}

// PoolCounts is one pool's counters.
type PoolCounts struct {
	SKU        string
	Available  transfer.Units
	Held       transfer.Units
	Sold       transfer.Units
	CreditedIn transfer.Units
	DebitedOut transfer.Units
}

// CreditRequest adds a transfer's units to this region's pool for (Sale, SKU).
type CreditRequest struct {
	Generation int64
	TransferID string
	Sale       string
	SKU        string
	Units      transfer.Units
}
