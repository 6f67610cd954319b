package region

import (
	"fmt"

	"github.com/quotaworks/quota/transfer"
)

// The Core's participant steps mirror creditOp, debitOp, refuseOp and transitionOut: the
// fence first (raised even when the step then answers an error, as the SQL batch commits
// it), then the shared transfer.Decide* rule, then the counters.

// record returns a copy of m[id] (nil: none), as the Decide rules take a record.
func record[T any](m map[string]T, id string) *T {
	v, ok := m[id]
	if !ok {
		return nil
	}
	return &v
}

// Credit is step 4 at this destination: available and credited_in rise once per transfer
// id (I3, I5), fenced (I4).
func (c *Core) Credit(req CreditRequest) (transfer.InState, error) {
	if err := c.admit(req.Sale, req.Generation); err != nil {
		return "", err
	}
	t, ok := c.sales[req.Sale]
	if !ok {
		return "", fmt.Errorf("sale_id %q: %w", req.Sale, ErrNotFound)
	}
	if !t.HasSKU(req.SKU) {
		return "", fmt.Errorf("sku %q is not in sale %s: %w", req.SKU, req.Sale, ErrNotFound)
	}
	want := transfer.InboundRecord{ID: req.TransferID, Sale: req.Sale, SKU: req.SKU, Units: req.Units}
	st, add, err := transfer.DecideCredit(record(c.in, req.TransferID), want)
	if err != nil {
		return "", transferErr(req.TransferID, err)
	}
	if add {
		p, b := c.pool(poolKey{req.Sale, req.SKU})
		p.available += req.Units
		b.creditedIn += req.Units
		want.State = st
		c.in[req.TransferID] = want
	}
	return st, nil
}

// Refuse is the abort step at this destination: a refused tombstone unless it credited.
func (c *Core) Refuse(req CreditRequest) (transfer.InState, error) {
	if err := c.admit(req.Sale, req.Generation); err != nil {
		return "", err
	}
	st, tombstone := transfer.DecideRefuse(record(c.in, req.TransferID))
	if tombstone {
		c.in[req.TransferID] = transfer.InboundRecord{ID: req.TransferID, Sale: req.Sale, SKU: req.SKU, Units: req.Units, State: st}
	}
	return st, nil
}

// Debit is step 2 at this source: available falls and debited_out rises once per transfer
// id, or a refused tombstone is recorded (I1, I3, I5), fenced (I4).
func (c *Core) Debit(req DebitRequest) (transfer.OutState, error) { return c.debit(req, false) }

// RefuseDebit cancels a requested transfer at this source: a refused tombstone unless it was
// debited first (I5), fenced (I4). It answers the source's record, like Region.RefuseDebit.
func (c *Core) RefuseDebit(req DebitRequest) (transfer.OutState, error) { return c.debit(req, true) }

func (c *Core) debit(req DebitRequest, refuse bool) (transfer.OutState, error) {
	if err := c.admit(req.Sale, req.Generation); err != nil {
		return "", err
	}
	have := record(c.out, req.TransferID)
	pk := poolKey{req.Sale, req.SKU}
	var avail transfer.Units
	if p := c.m.pools[pk]; p != nil && !refuse {
		avail = p.available
	}
	want := transfer.OutboundRecord{ID: req.TransferID, Sale: req.Sale, SKU: req.SKU, To: req.To, Units: req.Units}
	st, take, err := transfer.DecideDebit(have, want, avail)
	if err != nil {
		return "", transferErr(req.TransferID, err)
	}
	if have != nil {
		return st, nil
	}
	if take {
		p, b := c.pool(pk)
		p.available -= req.Units
		b.debitedOut += req.Units
	}
	want.State = st
	c.out[req.TransferID] = want
	return st, nil
}

// Restore returns a refused transfer's units to this source (pending → voided; I1, I3, I5).
func (c *Core) Restore(ref TransferRef) (transfer.OutState, error) {
	return c.transitionOut(ref, transfer.OutVoided)
}

// Settle records that the destination credited the transfer (pending → settled).
func (c *Core) Settle(ref TransferRef) (transfer.OutState, error) {
	return c.transitionOut(ref, transfer.OutSettled)
}

func (c *Core) transitionOut(ref TransferRef, to transfer.OutState) (transfer.OutState, error) {
	if err := c.admit(ref.Sale, ref.Generation); err != nil {
		return "", err
	}
	have := record(c.out, ref.TransferID)
	if have != nil && have.Sale != ref.Sale {
		return "", fmt.Errorf("transfer %s belongs to sale %s: %w", ref.TransferID, have.Sale, ErrConflict)
	}
	st, change, err := transfer.DecideOut(have, to)
	if err != nil {
		return "", transferErr(ref.TransferID, err)
	}
	if !change {
		return st, nil
	}
	if to == transfer.OutVoided {
		p, b := c.pool(poolKey{have.Sale, have.SKU})
		p.available += have.Units
		b.creditedIn += have.Units
	}
	have.State = to
	c.out[ref.TransferID] = *have
	return st, nil
}
