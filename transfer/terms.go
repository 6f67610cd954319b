package transfer

import (
	"fmt"
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
	// Admission is the sale's waiting room; its zero value is a sale without one.
	Admission AdmissionTerms
}

// AdmissionTerms are a sale's waiting room at each region: how many buyers per second it
// admits, how long the ticket it gives each lasts, and how many tickets may be live (issued,
// neither used nor expired) at once. Rate 0 is a sale without a waiting room: a reservation
// needs no ticket, and the per-user limit holds per region only.
type AdmissionTerms struct {
	Rate      int64
	TicketTTL time.Duration
	MaxLive   int64
}

// Limits and defaults of AdmissionTerms.
const (
	MaxAdmitRate     = 100_000
	DefaultTicketTTL = 2 * time.Minute
	MaxLiveTickets   = 1_000_000
	// liveSeconds is the default MaxLive in seconds of Rate: tickets live for about this long
	// on average before they are used.
	liveSeconds = 30
)

// Waiting reports whether the sale has a waiting room (reservations need a ticket).
func (a AdmissionTerms) Waiting() bool { return a.Rate > 0 }

// WithDefaults fills a waiting room's unset TicketTTL and MaxLive.
func (a AdmissionTerms) WithDefaults() AdmissionTerms {
	if a.Rate <= 0 {
		return a
	}
	if a.TicketTTL == 0 {
		a.TicketTTL = DefaultTicketTTL
	}
	if a.MaxLive == 0 {
		a.MaxLive = min(a.Rate*liveSeconds, MaxLiveTickets)
	}
	return a
}

// Check names the first bad field of the terms and why, or returns "" for both.
func (a AdmissionTerms) Check() (field, reason string) {
	switch {
	case a.Rate < 0 || a.Rate > MaxAdmitRate:
		return "admit_rate", fmt.Sprintf("must be 0..%d buyers per second, got %d", MaxAdmitRate, a.Rate)
	case a.Rate == 0 && (a.TicketTTL != 0 || a.MaxLive != 0):
		return "admit_rate", "a sale without a waiting room (admit_rate 0) has no ticket_ttl or max_live_tickets"
	case a.Rate == 0:
		return "", ""
	case a.TicketTTL < 10*time.Second || a.TicketTTL > time.Hour:
		return "ticket_ttl", fmt.Sprintf("must be 10s..1h, got %s", a.TicketTTL)
	case a.MaxLive < 1 || a.MaxLive > MaxLiveTickets:
		return "max_live_tickets", fmt.Sprintf("must be 1..%d, got %d", MaxLiveTickets, a.MaxLive)
	}
	return "", ""
}

// HasSKU reports whether sku is one of the sale's SKUs.
func (t SaleTerms) HasSKU(sku string) bool { return slices.Contains(t.SKUs, sku) }

// Stock is a pool's units that may still be sold: available to take, and held (a hold may
// expire or be released back).
type Stock struct {
	Available Units
	Held      Units
}
