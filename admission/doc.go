// Package admission is the storefront's front door, as pure rules and state with no I/O:
// the waiting room that admits buyers to a sale at a configured rate (room.go; its line of
// queued entries in queue.go, a binding's outcomes in outcome.go, a new leader's reload in
// restore.go, and the feed of changes storefront edges follow in feed.go and mirror.go), the
// signed one-use tickets it hands out (ticket.go, keyring.go), the waitlist that offers units
// which come back after a sell-out to the buyers who asked first (waitlist.go), and the token
// buckets that bound how fast one buyer or one address may knock (limiter.go).
//
// Nothing here reads a clock, a file or the network: callers pass the time and the bytes.
// The region (region/door.go, region/waitlist.go) owns one room and one waitlist per sale it
// leads, binds each admitted buyer to it through the cluster-wide record (the global per-user
// limit), and checks a reservation's ticket in its writer, where the ticket's one use is
// recorded with the hold.
package admission

import (
	"time"

	"github.com/quotaworks/quota/internal/apierr"
)

// Errors a caller tests with errors.Is; apierr maps them to gRPC and HTTP codes.
var (
	// ErrTicketInvalid: the ticket's signature, expiry, sale, user or region does not match.
	ErrTicketInvalid = apierr.ErrTicketInvalid
	// ErrTicketUsed: the ticket already backs a reservation with another request key.
	ErrTicketUsed = apierr.ErrTicketUsed
)

// Ticket is what an admission grants: the right to make one reservation in Sale at Region
// as User until Expires. Admission names the admission that issued it; a ticket backs at most
// one request key (recorded with the hold). SKU is set only on a waitlist offer: such a
// ticket may take the units set aside for it, of that SKU only. KeyID names the key that
// signed it.
type Ticket struct {
	Sale      string
	User      string
	Region    string
	Admission string
	SKU       string
	Expires   time.Time
	KeyID     string
}
