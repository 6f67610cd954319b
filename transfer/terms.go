package transfer

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
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
	// ReturnURL is where the regions' waiting-room page sends an admitted shopper, with the
	// ticket ("" : the page admits no one; CheckReturnURL says what is allowed). Absent
	// from a sale's definition when empty, so sales made before it keep theirs.
	ReturnURL string `json:",omitempty"`
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
	case a.Rate == 0 && (a.TicketTTL != 0 || a.MaxLive != 0 || a.ReturnURL != ""):
		return "admit_rate", "a sale without a waiting room (admit_rate 0) has no ticket_ttl, max_live_tickets or room_return_url"
	case a.Rate == 0:
		return "", ""
	case a.TicketTTL < 10*time.Second || a.TicketTTL > time.Hour:
		return "ticket_ttl", fmt.Sprintf("must be 10s..1h, got %s", a.TicketTTL)
	case a.MaxLive < 1 || a.MaxLive > MaxLiveTickets:
		return "max_live_tickets", fmt.Sprintf("must be 1..%d, got %d", MaxLiveTickets, a.MaxLive)
	}
	if why := CheckReturnURL(a.ReturnURL); why != "" {
		return "room_return_url", why
	}
	return "", ""
}

// MaxReturnURLLen bounds a sale's room_return_url, in bytes: the page appends a ticket
// (admission.MaxTokenLen) to it, and the whole must stay a URL every browser takes.
const MaxReturnURLLen = 1024

// CheckReturnURL reports why u cannot be a sale's room_return_url, or "" when it can: empty,
// or an absolute URL with a host, https (or http on a loopback host: 127.0.0.0/8, ::1,
// localhost, for a store under test), with no user name or password and no fragment, of
// printable ASCII, at most MaxReturnURLLen bytes.
func CheckReturnURL(u string) string {
	if u == "" {
		return ""
	}
	if len(u) > MaxReturnURLLen {
		return fmt.Sprintf("is %d bytes, longer than %d", len(u), MaxReturnURLLen)
	}
	for i := 0; i < len(u); i++ {
		if u[i] <= ' ' || u[i] > '~' {
			return "must be printable ASCII with no spaces (percent-encode the rest)"
		}
	}
	p, err := url.Parse(u)
	switch {
	case err != nil:
		return "is not a URL: " + err.Error()
	case p.Scheme != "https" && p.Scheme != "http":
		return fmt.Sprintf("must be an absolute https URL, got scheme %q", p.Scheme)
	case p.Host == "" || p.Hostname() == "":
		return "must name a host"
	case p.User != nil:
		return "must not carry a user name or password"
	case p.Fragment != "" || strings.Contains(u, "#"):
		return "must not have a fragment (#...)"
	case p.Scheme == "http" && !loopbackHost(p.Hostname()):
		return "must be https (http only on a loopback host, for a store under test)"
	}
	return ""
}

// loopbackHost reports whether host is localhost or a loopback IP address.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// HasSKU reports whether sku is one of the sale's SKUs.
func (t SaleTerms) HasSKU(sku string) bool { return slices.Contains(t.SKUs, sku) }

// Stock is a pool's units that may still be sold: available to take, and held (a hold may
// expire or be released back).
type Stock struct {
	Available Units
	Held      Units
}
