package region

import (
	"fmt"

	"github.com/quotaworks/quota/transfer"
)

// The Core's participant steps run the same decisions and effects as the writer's SQL
// operations (transfer_effects.go): the fence first (raised even when the step then
// answers an error, as the SQL batch commits it), then the step's effects, applied to the
// Core's image by applyEffects instead of turned into statements.

// record returns a copy of m[id] (nil: none), as the Decide rules take a record.
func record[T any](m map[string]T, id string) *T {
	v, ok := m[id]
	if !ok {
		return nil
	}
	return &v
}

// applyEffects applies a step's effects to the Core's image: the pool's counters of sale
// and sku, and the transfer records.
func (c *Core) applyEffects(sale, sku string, eff transferEffects) {
	if eff.poolRow {
		p, b := c.pool(poolKey{sale, sku})
		p.available += eff.pool.available
		b.creditedIn += eff.pool.creditedIn
		b.debitedOut += eff.pool.debitedOut
	}
	if eff.in != nil {
		c.in[eff.in.ID] = *eff.in
	}
	if eff.out != nil {
		c.out[eff.out.ID] = *eff.out
	}
}

// Credit is step 4 at this destination (creditEffects), fenced (I4).
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
	st, eff, err := creditEffects(record(c.in, req.TransferID), req)
	if err != nil {
		return "", transferErr(req.TransferID, err)
	}
	c.applyEffects(req.Sale, req.SKU, eff)
	return st, nil
}

// Refuse is the abort step at this destination (refuseEffects), fenced (I4).
func (c *Core) Refuse(req CreditRequest) (transfer.InState, error) {
	if err := c.admit(req.Sale, req.Generation); err != nil {
		return "", err
	}
	st, eff := refuseEffects(record(c.in, req.TransferID), req)
	c.applyEffects(req.Sale, req.SKU, eff)
	return st, nil
}

// Debit is step 2 at this source (debitEffects), fenced (I4).
func (c *Core) Debit(req DebitRequest) (transfer.OutState, error) { return c.debit(req, false) }

// RefuseDebit cancels a requested transfer at this source: a refused tombstone unless it was
// debited first (I5), fenced (I4). It answers the source's record, like Region.RefuseDebit.
func (c *Core) RefuseDebit(req DebitRequest) (transfer.OutState, error) { return c.debit(req, true) }

func (c *Core) debit(req DebitRequest, refuse bool) (transfer.OutState, error) {
	if err := c.admit(req.Sale, req.Generation); err != nil {
		return "", err
	}
	var avail transfer.Units // a refused debit is decided as if the pool were empty
	if p := c.m.pools[poolKey{req.Sale, req.SKU}]; p != nil && !refuse {
		avail = p.available
	}
	st, eff, err := debitEffects(record(c.out, req.TransferID), req, avail)
	if err != nil {
		return "", transferErr(req.TransferID, err)
	}
	c.applyEffects(req.Sale, req.SKU, eff)
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
	st, eff, err := outEffects(have, to)
	if err != nil {
		return "", transferErr(ref.TransferID, err)
	}
	if have != nil {
		c.applyEffects(have.Sale, have.SKU, eff)
	}
	return st, nil
}
