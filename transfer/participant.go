package transfer

import (
	"errors"
	"fmt"
)

// The participant decisions below are the rules a region applies to its durable transfer
// records (docs/transfers.md, "The protocol", steps 2–5). The region's SQL operations and the deterministic
// simulation (sim) both call them, so a bug in a rule is a bug in both.

// Errors of the participant decisions; the region wraps them in its API errors.
var (
	// ErrOtherContent: a transfer id already recorded with other sale, SKU, pool or units.
	ErrOtherContent = errors.New("transfer id recorded with other content")
	// ErrNotDebited: a restore or settle of a transfer this source never debited.
	ErrNotDebited = errors.New("transfer was never debited here")
	// ErrWrongState: an outbound record that cannot make the transition asked for.
	ErrWrongState = errors.New("transfer record cannot make this transition")
	// ErrFencedGeneration: a request from a coordinator generation below the highest seen.
	ErrFencedGeneration = errors.New("generation below the highest seen")
	// ErrStaleEpoch: a region writer's batch under an epoch that is no longer the region's.
	ErrStaleEpoch = errors.New("writer epoch is no longer current")
)

// CurrentEpoch is the region writer's epoch fence (I4, and I6 through it): a batch of the
// leader that took epoch commits only while the region's recorded epoch is still epoch.
// Once a newer leader has raised it, a deposed leader's batches commit nothing, and so none
// of its decisions is acknowledged. fencing.CheckEpoch applies it to the locked epoch row;
// the deterministic simulation's store applies it to every batch; quota_check_epoch, the
// same rule in SQL for a batch sent in one round trip, is checked against it
// (region's TestEpochFenceRuleIsOne).
func CurrentEpoch(recorded, epoch int64) error {
	if epoch != recorded {
		return fmt.Errorf("writer epoch %d, recorded %d: %w", epoch, recorded, ErrStaleEpoch)
	}
	return nil
}

// Admit is the per-sale fence rule (I4: fences only rise): a request of generation gen is
// admitted when gen is positive and at least the highest generation seen, which then
// becomes gen.
func Admit(highest, gen int64) (int64, error) {
	if gen <= 0 || gen < highest {
		return highest, fmt.Errorf("generation %d, highest seen %d: %w", gen, highest, ErrFencedGeneration)
	}
	return gen, nil
}

// DecideCredit is step 4 at a destination. have is the existing record (nil: none); IDs are
// the caller's key and not compared. It
// returns the record's state after the step and whether the units must be added now, which
// happens once per transfer id: a retry answers credited again, a credit after a refusal
// answers refused (I5: never both).
func DecideCredit(have *InboundRecord, req InboundRecord) (InState, bool, error) {
	if have == nil {
		return InCredited, true, nil
	}
	if have.Sale != req.Sale || have.SKU != req.SKU || have.Units != req.Units {
		return "", false, ErrOtherContent
	}
	return have.State, false, nil
}

// DecideRefuse is the abort step at a destination: with no record it writes a refused
// tombstone (record = true), so no later credit applies; otherwise it reports the record.
func DecideRefuse(have *InboundRecord) (st InState, record bool) {
	if have == nil {
		return InRefused, true
	}
	return have.State, false
}

// DecideDebit is step 2 at a source. have is the existing record (nil: none); available is
// the pool's available count. With no record it debits (OutPending, take = true) when
// available covers the units, or records a refused tombstone (OutRefused) so a late retry
// cannot debit a transfer the coordinator has given up (I5). Either way a record is written
// when have is nil.
func DecideDebit(have *OutboundRecord, req OutboundRecord, available Units) (st OutState, take bool, err error) {
	if have != nil {
		if have.Sale != req.Sale || have.SKU != req.SKU || have.To != req.To || have.Units != req.Units {
			return "", false, ErrOtherContent
		}
		return have.State, false, nil
	}
	if available < req.Units {
		return OutRefused, false, nil
	}
	return OutPending, true, nil
}

// DecideOut is a source's restore (to = OutVoided: the units come back, I1) or settle (to =
// OutSettled: bookkeeping only). Only a pending record moves, once; asking again for the
// state it is in answers it unchanged (change = false). A settled transfer cannot be
// restored nor a voided one settled (I5).
func DecideOut(have *OutboundRecord, to OutState) (st OutState, change bool, err error) {
	switch {
	case have == nil:
		return "", false, ErrNotDebited
	case have.State == to:
		return to, false, nil
	case have.State != OutPending:
		return have.State, false, fmt.Errorf("%s, cannot become %s: %w", have.State, to, ErrWrongState)
	}
	return to, true, nil
}

// AfterDebit is the coordinator's reading of a source's answer to step 2: the event it
// records, or an error for an answer that decides nothing (the transfer stays, and is
// stranded if that lasts).
func AfterDebit(st OutState) (Event, error) {
	switch st {
	case OutRefused:
		return Aborted, nil
	case OutPending, OutSettled:
		return Debited, nil
	}
	return "", fmt.Errorf("unexpected answer %q to a debit", st)
}

// AfterCredit is the coordinator's reading of a destination's answer to step 4 (or to a
// refusal): Credited, Refused (the source must restore before it is recorded), or an error.
func AfterCredit(st InState) (Event, error) {
	switch st {
	case InCredited:
		return Credited, nil
	case InRefused:
		return Refused, nil
	}
	return "", fmt.Errorf("unexpected answer %q to a credit", st)
}
