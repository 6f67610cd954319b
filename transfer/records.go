package transfer

import "time"

// Records a region's database keeps that the coordinator's auditors read directly, as they
// read RegionBooks: a buyer's units per SKU, for the per-user limit across regions, and the
// payments that came too late, to refund.

// BuyerUnits is what one buyer holds and bought of one SKU of a sale at one region: the
// units that count against the sale's per-user limit (held, sold, and sold then archived).
type BuyerUnits struct {
	SKU, User string
	Units     Units
}

// LatePayment is a payment that came for a hold no longer live: the storefront was told to
// refund it (outcome REFUND), and finance refunds from this list.
type LatePayment struct {
	Region, HoldID, PaymentID string
	// HoldState is the hold's state when the payment came: expired or released.
	HoldState  string
	ReceivedAt time.Time
	// The hold's sale, SKU, buyer and units, and when it expired or was released; empty when
	// the hold is in neither holds nor holds_closed.
	Sale, SKU, User string
	Quantity        Units
	ExpiresAt       time.Time
	ClosedAt        time.Time
}

// Reason says why a late payment must be refunded.
func (l LatePayment) Reason() string {
	switch l.HoldState {
	case "expired":
		return "the hold had expired when the payment came"
	case "released":
		return "the hold had been released when the payment came"
	}
	return "the hold was " + l.HoldState + " when the payment came"
}
