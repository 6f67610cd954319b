package transfer

import "fmt"

// State is a transfer's state in the coordinator's ledger (docs/transfers.md).
type State string

// The ledger states. requested: recorded, nothing debited. pending: debited at the source,
// the units are in flight. posted: credited at the destination (final). voided: refused at
// the destination and restored at the source (final).
const (
	Requested State = "requested"
	Pending   State = "pending"
	Posted    State = "posted"
	Voided    State = "voided"
)

// Final reports whether no transition leaves s.
func (s State) Final() bool { return s == Posted || s == Voided }

// Valid reports whether s is one of the four states.
func (s State) Valid() bool {
	switch s {
	case Requested, Pending, Posted, Voided:
		return true
	}
	return false
}

// Event is what happened to a transfer, as learned by the coordinator.
type Event string

// The events that move a transfer.
const (
	// Debited: the source answered that it debited the units (or, for the unallocated pool,
	// the ledger debited them in the same transaction).
	Debited Event = "debited"
	// Credited: the destination answered that its durable record says credited.
	Credited Event = "credited"
	// Refused: the destination answered that its durable record says refused, and the
	// source restored the units.
	Refused Event = "refused"
	// Aborted: the source answered that it never debited (requested → voided).
	Aborted Event = "aborted"
)

// Next is the transition table. Each allowed transition preserves I1 (the units are in
// exactly one term at every step) and I5 (a transfer reaches credited or restored once,
// never both). It returns an error for every transition not in the table.
func Next(s State, e Event) (State, error) {
	switch {
	case s == Requested && e == Debited:
		return Pending, nil
	case s == Requested && e == Aborted:
		return Voided, nil
	case s == Pending && e == Credited:
		return Posted, nil
	case s == Pending && e == Refused:
		return Voided, nil
	case s == Posted && e == Credited, s == Voided && (e == Refused || e == Aborted), s == Pending && e == Debited:
		// Replies to retried idempotent steps land here: nothing changes.
		return s, nil
	}
	return s, fmt.Errorf("transfer: illegal transition %s --%s-->", s, e)
}

// InState is a destination's durable record of an inbound transfer.
type InState string

// The destination's records: credited (units added once) or refused (a tombstone that makes
// any later credit fail).
const (
	InCredited InState = "credited"
	InRefused  InState = "refused"
)

// OutState is a source's durable record of an outbound transfer.
type OutState string

// The source's records. pending: debited, in flight. settled: the destination credited it.
// voided: restored at the source. refused: the debit was refused (a tombstone; nothing
// was debited and a late debit of the same transfer cannot apply).
const (
	OutPending OutState = "pending"
	OutSettled OutState = "settled"
	OutVoided  OutState = "voided"
	OutRefused OutState = "refused"
)

// Debited reports whether the record counts the units as debited at the source (and, unless
// restored, either credited or in flight).
func (s OutState) Debited() bool { return s == OutPending || s == OutSettled || s == OutVoided }

// Must returns s, panicking on err: for transitions the caller has already checked.
func Must(s State, err error) State {
	if err != nil {
		panic(err)
	}
	return s
}
