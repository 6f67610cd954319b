package transfer

import "time"

// PoolBooks is one region pool's durable counters, as the auditor reads them.
// I3: CreditedIn − DebitedOut == Available + Held + Sold.
type PoolBooks struct {
	Sale       string
	SKU        string
	Available  Units
	Held       Units
	Sold       Units
	CreditedIn Units
	DebitedOut Units
	// HeldInHolds and SoldInHolds are the sums over the pool's hold rows in state held and
	// sold; they must equal Held and Sold.
	HeldInHolds Units
	SoldInHolds Units
}

// InboundRecord is a destination's durable record of one transfer.
type InboundRecord struct {
	ID    string
	Sale  string
	SKU   string
	Units Units
	State InState
}

// OutboundRecord is a source's durable record of one transfer.
type OutboundRecord struct {
	ID    string
	Sale  string
	SKU   string
	To    string
	Units Units
	State OutState
}

// RegionBooks is one consistent snapshot of a region's durable state for one sale.
type RegionBooks struct {
	Region   string
	Pools    []PoolBooks
	Inbound  map[string]InboundRecord
	Outbound map[string]OutboundRecord
}

// Transfer is one ledger entry.
type Transfer struct {
	CreatedAt  time.Time
	ID         string
	Sale       string
	SKU        string
	From       string
	To         string
	Units      Units
	State      State
	Generation int64
	Stranded   bool
	Reason     string
	// Settled is true once the source region has recorded the credit (or the source is the
	// unallocated pool).
	Settled bool
}

// MaxBooksSales bounds the sales whose books one read of a region's database returns at once.
const MaxBooksSales = 1000
