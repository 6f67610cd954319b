package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// driveLoop drives every unfinished transfer again every RetryInterval while this
// coordinator leads: after a restart or a change of leader, nothing is left half done.
func (c *Coordinator) driveLoop(ctx context.Context, gen int64) {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.RetryInterval)
	defer t.Stop()
	for {
		c.driveUnfinished(ctx, gen)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Coordinator) driveUnfinished(ctx context.Context, gen int64) {
	rows, err := c.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE state IN ('requested', 'pending') ORDER BY created_at`)
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.Warn("list unfinished transfers", "err", err)
		}
		return
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil {
		return
	}
	for _, t := range ts {
		if ctx.Err() != nil {
			return
		}
		c.drive(ctx, gen, t)
	}
}

// drive takes one transfer from the unallocated pool as far as its destination's answers
// allow and returns its state in the ledger afterwards. It never decides an outcome the
// destination has not recorded: no answer leaves the transfer pending, flagged stranded once
// it has been in flight longer than StrandAfter.
func (c *Coordinator) drive(ctx context.Context, gen int64, t transfer.Transfer) transfer.Transfer {
	if t.State.Final() {
		return t
	}
	if t.From != transfer.Unallocated {
		panic(fmt.Sprintf("coordinator: transfer %s from region %s: only allocation is implemented", t.ID, t.From))
	}
	dest, ok := c.regions[t.To]
	if !ok {
		return c.strand(ctx, gen, t, fmt.Sprintf("destination region %q is not configured", t.To))
	}
	state, err := c.creditAt(ctx, gen, dest, t)
	if err != nil {
		return c.strand(ctx, gen, t, fmt.Sprintf("credit at %s: %v", t.To, err))
	}
	event := transfer.Credited
	if state == transfer.InRefused {
		event = transfer.Refused
	}
	next, err := transfer.Next(t.State, event)
	if err != nil {
		panic(err) // the ledger and the table disagree: a programmer error
	}
	if err := c.finish(ctx, gen, t, next); err != nil {
		c.cfg.Logger.Warn("finish transfer", "transfer", t.ID, "err", err)
		return t
	}
	t.State, t.Stranded, t.Reason = next, false, ""
	return t
}

func (c *Coordinator) creditAt(ctx context.Context, gen int64, dest RegionLink, t transfer.Transfer) (transfer.InState, error) {
	sale, err := c.GetSale(ctx, t.Sale)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	if err := dest.Participant.PutSale(cctx, gen, sale.Terms); err != nil {
		return "", fmt.Errorf("put sale: %w", err)
	}
	return dest.Participant.Credit(cctx, gen, t)
}

// finish records the destination's durable answer in the ledger: posted (credited there),
// or voided with the units restored to the unallocated pool (refused there). Guarded on the
// transfer still pending, so it happens once (I5); fenced (I4).
func (c *Coordinator) finish(ctx context.Context, gen int64, t transfer.Transfer, to transfer.State) error {
	now := c.cfg.Clock.Now()
	return c.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE transfers SET state = $2, stranded = false, reason = '', updated_at = $3
			WHERE transfer_id = $1 AND state = 'pending'`, t.ID, string(to), now)
		if err != nil || tag.RowsAffected() == 0 {
			return err // already finished by an earlier drive: nothing to do
		}
		if to == transfer.Voided {
			_, err = tx.Exec(ctx, `UPDATE skus SET unallocated = unallocated + $3 WHERE sale_id = $1 AND sku = $2`, t.Sale, t.SKU, int64(t.Units))
		}
		return err
	})
}

// strand flags a transfer whose destination has not answered for StrandAfter: its units stay
// in flight, out of circulation and visible, until the destination answers.
func (c *Coordinator) strand(ctx context.Context, gen int64, t transfer.Transfer, reason string) transfer.Transfer {
	if errors.Is(ctx.Err(), context.Canceled) {
		return t
	}
	c.cfg.Logger.Warn("transfer not finished", "transfer", t.ID, "to", t.To, "reason", reason)
	if t.Stranded || c.cfg.Clock.Now().Sub(t.CreatedAt) < c.cfg.StrandAfter {
		t.Reason = reason
		return t
	}
	err := c.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE transfers SET stranded = true, reason = $2, updated_at = $3 WHERE transfer_id = $1 AND state = 'pending'`,
			t.ID, reason, c.cfg.Clock.Now())
		return err
	})
	if err == nil {
		t.Stranded = true
	}
	t.Reason = reason
	return t
}
