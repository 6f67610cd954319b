package transfer

import (
	"slices"
	"time"
)

// SaleTerms are a sale's rules, as the coordinator records them and publishes them to every
// region (PutSale): its SKUs, the per-user limit, how long a hold lasts, and when it opens.
// Terms never change once recorded.
type SaleTerms struct {
	Sale         string
	SKUs         []string
	PerUserLimit Units
	HoldTTL      time.Duration
	OpensAt      time.Time
}

// HasSKU reports whether sku is one of the sale's SKUs.
func (t SaleTerms) HasSKU(sku string) bool { return slices.Contains(t.SKUs, sku) }
