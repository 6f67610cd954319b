package region

import "github.com/quotaworks/quota/transfer"

// A region's transfer steps (credit, refuse, debit, restore, settle) are decided and their
// effects produced here, once: from the durable records the step read, each function below
// returns the answer and the transferEffects. The SQL writer (participant.go) turns the
// effects into statements in the step's fenced transaction; Core (core_transfer.go), which
// the simulation runs, applies them to its image. What stays SQL-only is the statements
// themselves, covered by the region's integration tests.

// countsDelta is how a step changes a pool's counters. Every step keeps I3 (credited_in −
// debited_out == available + held + sold): available moves with credited_in or debited_out.
type countsDelta struct{ available, creditedIn, debitedOut transfer.Units }

// transferEffects is what one transfer step changes at a region: a pool's counters (when
// poolRow, its row is written, created if missing, even by a zero change), a destination
// record to insert, a source record to insert (newOut) or to move from pending to its
// state. The zero value changes nothing.
type transferEffects struct {
	poolRow bool
	pool    countsDelta
	in      *transfer.InboundRecord
	out     *transfer.OutboundRecord
	newOut  bool
}

// creditEffects is step 4 at the destination (transfer.DecideCredit): the units are added
// to available and credited_in once per transfer id, with the credited record (I3, I5: a
// retry adds nothing, a refused transfer is never credited).
func creditEffects(have *transfer.InboundRecord, req CreditRequest) (transfer.InState, transferEffects, error) {
	want := transfer.InboundRecord{ID: req.TransferID, Sale: req.Sale, SKU: req.SKU, Units: req.Units}
	st, add, err := transfer.DecideCredit(have, want)
	if err != nil || !add {
		return st, transferEffects{}, err
	}
	want.State = st
	return st, transferEffects{poolRow: true, pool: countsDelta{available: req.Units, creditedIn: req.Units}, in: &want}, nil
}

// refuseEffects is the abort step at the destination (transfer.DecideRefuse): a refused
// tombstone unless the transfer was credited (I5: never both credited and restored).
func refuseEffects(have *transfer.InboundRecord, req CreditRequest) (transfer.InState, transferEffects) {
	st, tombstone := transfer.DecideRefuse(have)
	if !tombstone {
		return st, transferEffects{}
	}
	rec := transfer.InboundRecord{ID: req.TransferID, Sale: req.Sale, SKU: req.SKU, Units: req.Units, State: st}
	return st, transferEffects{in: &rec}
}

// debitEffects is step 2 at the source (transfer.DecideDebit), given the units available:
// once per transfer id, available falls and debited_out rises by the units, recorded as
// pending (I1: the units move to in flight; I3); or a refused tombstone is recorded, so a
// late debit cannot apply (I5). A transfer already recorded changes nothing.
func debitEffects(have *transfer.OutboundRecord, req DebitRequest, avail transfer.Units) (transfer.OutState, transferEffects, error) {
	want := transfer.OutboundRecord{ID: req.TransferID, Sale: req.Sale, SKU: req.SKU, To: req.To, Units: req.Units}
	st, take, err := transfer.DecideDebit(have, want, avail)
	if err != nil || have != nil {
		return st, transferEffects{}, err
	}
	want.State = st
	eff := transferEffects{out: &want, newOut: true}
	if take {
		eff.poolRow, eff.pool = true, countsDelta{available: -req.Units, debitedOut: req.Units}
	}
	return st, eff, nil
}

// outEffects moves a pending outbound transfer to `to` (transfer.DecideOut): settled is
// bookkeeping only; voided (a restore, after the destination's refusal) returns the units
// to available and credited_in (I1: in flight → available; I3; I5: once, never after a
// settle).
func outEffects(have *transfer.OutboundRecord, to transfer.OutState) (transfer.OutState, transferEffects, error) {
	st, change, err := transfer.DecideOut(have, to)
	if err != nil || !change {
		return st, transferEffects{}, err
	}
	rec := *have
	rec.State = to
	eff := transferEffects{out: &rec}
	if to == transfer.OutVoided {
		eff.poolRow, eff.pool = true, countsDelta{available: have.Units, creditedIn: have.Units}
	}
	return st, eff, nil
}
