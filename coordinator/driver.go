package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// driveLoop drives every unfinished transfer again every RetryInterval while this
// coordinator leads: after a restart or a change of leader, nothing is left half done.
func (c *Coordinator) driveLoop(ctx context.Context, gen int64) {
	defer c.wg.Done()
	every(ctx, c.cfg.RetryInterval, func() {
		if err := c.driveUnfinished(ctx, gen); err != nil {
			// Each failure was logged at Warn where it happened, with its transfer and step.
			c.cfg.Logger.Debug("drive unfinished transfers: round incomplete", "err", err)
		}
	})
}

// every runs round at once, then every interval, until ctx ends. The leader's background
// loops are made of it; each runs in the goroutine that Lead starts and StepDown waits for.
func every(ctx context.Context, interval time.Duration, round func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		round()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// driveUnfinished is one round of driveLoop: it drives every unfinished transfer once, in
// the order they were created. A transfer whose ledger write fails does not stop the round;
// the round returns every such error joined (each logged with its transfer and step where
// it happened; errors.Is finds ErrFenced among them), or the failure to list the transfers.
func (c *Coordinator) driveUnfinished(ctx context.Context, gen int64) error {
	rows, err := c.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE state IN ('requested', 'pending') OR (state = 'posted' AND NOT settled) ORDER BY created_at`)
	if err != nil {
		return c.roundFailed(ctx, "list unfinished transfers", err)
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil {
		return c.roundFailed(ctx, "scan unfinished transfers", err)
	}
	var errs []error
	for _, t := range ts {
		if ctx.Err() != nil {
			break
		}
		if _, err := c.drive(ctx, gen, t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// roundFailed logs a driveUnfinished round that could not read its transfers (quietly when
// ctx ended: the coordinator is stepping down) and returns the error wrapped with its step.
func (c *Coordinator) roundFailed(ctx context.Context, step string, err error) error {
	level := slog.LevelWarn
	if ctx.Err() != nil {
		level = slog.LevelDebug
	}
	c.cfg.Logger.Log(ctx, level, step, "step", step, "err", err)
	return fmt.Errorf("%s: %w", step, err)
}

// stepFailed logs a step of transfer t that failed (quietly when ctx ended: the coordinator
// is stepping down) and returns its error wrapped with the transfer and the step. A fenced
// write (a newer coordinator leads) stays ErrFenced to errors.Is, and is logged as fenced.
func (c *Coordinator) stepFailed(ctx context.Context, t transfer.Transfer, step string, err error) error {
	level := slog.LevelWarn
	if ctx.Err() != nil {
		level = slog.LevelDebug
	}
	c.cfg.Logger.Log(ctx, level, "transfer step failed", "transfer", t.ID, "step", step,
		"fenced", errors.Is(err, ErrFenced), "err", err)
	return fmt.Errorf("transfer %s: %s: %w", t.ID, step, err)
}

// drive takes a transfer as far as the participants' answers allow (DESIGN.md §6)
// and returns its ledger state afterwards. Every step is idempotent by transfer id, so a
// lost reply is resolved by asking again. It never decides an outcome a participant has not
// recorded: no answer leaves the transfer where it is, flagged stranded once it has been
// unfinished longer than StrandAfter; that is not an error. A ledger write that fails while
// stranding or settling it is (ErrFenced to errors.Is when a newer coordinator leads), and
// the transfer returned with it is not stranded, not settled, in the state the ledger has.
func (c *Coordinator) drive(ctx context.Context, gen int64, t transfer.Transfer) (transfer.Transfer, error) {
	for !t.State.Final() {
		next, err := c.step(ctx, gen, t)
		if err != nil {
			return c.strand(ctx, gen, t, err.Error())
		}
		t = next
	}
	if t.State == transfer.Posted && !t.Settled {
		return c.settle(ctx, gen, t)
	}
	return t, nil
}

// step performs the next protocol step of an unfinished transfer and records its outcome.
func (c *Coordinator) step(ctx context.Context, gen int64, t transfer.Transfer) (transfer.Transfer, error) {
	switch t.State {
	case transfer.Requested:
		st, err := c.debitAt(ctx, gen, t)
		if err != nil {
			return t, fmt.Errorf("debit at %s: %w", t.From, err)
		}
		return c.recordDebit(ctx, gen, t, st,
			fmt.Sprintf("source %s refused the debit: it had fewer than %d available, or the transfer was cancelled", t.From, t.Units))

	case transfer.Pending:
		st, err := c.creditAt(ctx, gen, t)
		if err != nil {
			return t, fmt.Errorf("credit at %s: %w", t.To, err)
		}
		ev, err := transfer.AfterCredit(st)
		if err != nil {
			return t, fmt.Errorf("at %s: %w", t.To, err) // never guess: strand
		}
		if ev == transfer.Refused {
			return c.abort(ctx, gen, t)
		}
		return c.advance(ctx, gen, t, transfer.Credited, "")
	}
	panic(fmt.Sprintf("coordinator: step of transfer %s in state %s", t.ID, t.State))
}

// recordDebit moves a requested transfer as the source's record says (its answer to a Debit
// or a RefuseDebit): debited → pending (I1: the units are in flight), refused → voided with
// the reason given (nothing left the source). Any other answer decides nothing.
func (c *Coordinator) recordDebit(ctx context.Context, gen int64, t transfer.Transfer, st transfer.OutState, refused string) (transfer.Transfer, error) {
	ev, err := transfer.AfterDebit(st)
	if err != nil {
		return t, fmt.Errorf("at %s: %w", t.From, err) // never guess: strand
	}
	if ev == transfer.Aborted {
		return c.advance(ctx, gen, t, transfer.Aborted, refused)
	}
	return c.advance(ctx, gen, t, transfer.Debited, "")
}

// abort finishes a transfer the destination has durably refused: the source restores the
// units (never before that refusal: I5), then the ledger voids it.
func (c *Coordinator) abort(ctx context.Context, gen int64, t transfer.Transfer) (transfer.Transfer, error) {
	if t.From != transfer.Unallocated {
		src, err := c.link(t.From)
		if err != nil {
			return t, err
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		defer cancel()
		if _, err := src.Participant.Restore(cctx, gen, t); err != nil {
			return t, fmt.Errorf("restore at %s: %w", t.From, err)
		}
	}
	return c.advance(ctx, gen, t, transfer.Refused, fmt.Sprintf("refused by %s", t.To))
}

func (c *Coordinator) link(region string) (RegionLink, error) {
	l, ok := c.regions[region]
	if !ok {
		return l, fmt.Errorf("region %q is not configured", region)
	}
	return l, nil
}

// debitAt is step 2. From the unallocated pool the debit is the ledger's own: it happens in
// the same transaction as requested → pending, in advance.
func (c *Coordinator) debitAt(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	if t.From == transfer.Unallocated {
		return transfer.OutPending, nil
	}
	src, err := c.link(t.From)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	return src.Participant.Debit(cctx, gen, t)
}

// creditAt is step 4. To the unallocated pool the credit is the ledger's own (in advance).
func (c *Coordinator) creditAt(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error) {
	if t.To == transfer.Unallocated {
		return transfer.InCredited, nil
	}
	dest, err := c.link(t.To)
	if err != nil {
		return "", err
	}
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

// settle records at a posted transfer's source that it was credited, then marks it settled
// in the ledger. A source that does not answer leaves it unsettled, to be asked again (not
// an error); an unknown source region or a failed ledger write is an error.
func (c *Coordinator) settle(ctx context.Context, gen int64, t transfer.Transfer) (transfer.Transfer, error) {
	src, err := c.link(t.From)
	if err != nil {
		return t, c.stepFailed(ctx, t, "settle: source", err)
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	if _, err := src.Participant.Settle(cctx, gen, t); err != nil {
		c.cfg.Logger.Warn("settle transfer", "transfer", t.ID, "step", "settle at source", "err", err)
		return t, nil
	}
	err = c.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE transfers SET settled = true WHERE transfer_id = $1`, t.ID)
		return err
	})
	if err != nil {
		return t, c.stepFailed(ctx, t, "settle: record settled", err)
	}
	t.Settled = true
	return t, nil
}

// advance records event in the ledger, fenced (I4) and guarded on the state it read, with
// the unallocated pool's side of it in the same transaction: requested → pending from the
// pool takes its units (aborting when it has too few), pending → posted into the pool adds
// them, pending → voided from the pool restores them. Each preserves I1.
func (c *Coordinator) advance(ctx context.Context, gen int64, t transfer.Transfer, e transfer.Event, reason string) (transfer.Transfer, error) {
	// An answer the transition table does not allow is a programmer error: Must panics.
	next := transfer.Must(transfer.Next(t.State, e))
	now := c.cfg.Clock.Now()
	reason0 := reason
	err := c.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		next, reason = transfer.Must(transfer.Next(t.State, e)), reason0 // reset: the closure may run again
		delta := unallocatedDelta(t, next)
		if delta != 0 {
			tag, err := tx.Exec(ctx, `UPDATE skus SET unallocated = unallocated + $3 WHERE sale_id = $1 AND sku = $2 AND unallocated + $3 >= 0`,
				t.Sale, t.SKU, int64(delta))
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 { // the pool has too few: the debit is refused instead
				next, reason = transfer.Voided, fmt.Sprintf("unallocated pool had fewer than %d", t.Units)
			}
		}
		settled := t.From == transfer.Unallocated || next != transfer.Posted
		tag, err := tx.Exec(ctx, `UPDATE transfers SET state = $2, stranded = false, reason = $3, settled = $4, updated_at = $5
			WHERE transfer_id = $1 AND state = $6`, t.ID, string(next), reason, settled, now, string(t.State))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errLedgerMoved
		}
		return nil
	})
	if errors.Is(err, errLedgerMoved) {
		return c.reload(ctx, t)
	}
	if err != nil {
		return t, fmt.Errorf("ledger: %w", err)
	}
	t.State, t.Stranded, t.Reason, t.Settled = next, false, reason, t.From == transfer.Unallocated || next != transfer.Posted
	return t, nil
}

var errLedgerMoved = errors.New("transfer moved on in the ledger")

func unallocatedDelta(t transfer.Transfer, next transfer.State) transfer.Units {
	switch {
	case t.From == transfer.Unallocated && t.State == transfer.Requested && next == transfer.Pending:
		return -t.Units
	case t.From == transfer.Unallocated && t.State == transfer.Pending && next == transfer.Voided:
		return t.Units
	case t.To == transfer.Unallocated && t.State == transfer.Pending && next == transfer.Posted:
		return t.Units
	}
	return 0
}

// reload reads a transfer's current ledger row (another driver finished the step first).
func (c *Coordinator) reload(ctx context.Context, t transfer.Transfer) (transfer.Transfer, error) {
	rows, err := c.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE transfer_id = $1`, t.ID)
	if err != nil {
		return t, err
	}
	return pgx.CollectExactlyOneRow(rows, scanTransfer)
}

// strand flags a transfer whose next step has had no answer for StrandAfter: its
// units stay where the protocol left them (in flight when pending), out of circulation and
// visible, until the participant answers. Nothing is reassigned on a timeout. Before then it
// records only the reason, when it changed. A failed write of the reason or of the flag is
// returned (ErrFenced to errors.Is when a newer coordinator leads); the ledger row is then
// left as it was, and the transfer returned is not stranded.
func (c *Coordinator) strand(ctx context.Context, gen int64, t transfer.Transfer, reason string) (transfer.Transfer, error) {
	if ctx.Err() != nil {
		return t, nil
	}
	c.cfg.Logger.Warn("transfer not finished", "transfer", t.ID, "state", t.State, "reason", reason)
	stored := t.Reason
	t.Reason = reason
	if t.Stranded || c.cfg.Clock.Now().Sub(t.CreatedAt) < c.cfg.StrandAfter {
		if reason == stored { // shown by transfers list before the flag; written when it changes
			return t, nil
		}
		err := c.fencedTx(ctx, gen, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE transfers SET reason = $2, updated_at = $3
				WHERE transfer_id = $1 AND state IN ('requested', 'pending')`, t.ID, reason, c.cfg.Clock.Now())
			return err
		})
		if err != nil {
			return t, c.stepFailed(ctx, t, "strand: record reason", err)
		}
		return t, nil
	}
	err := c.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE transfers SET stranded = true, reason = $2, updated_at = $3
			WHERE transfer_id = $1 AND state IN ('requested', 'pending')`, t.ID, reason, c.cfg.Clock.Now())
		return err
	})
	if err != nil {
		return t, c.stepFailed(ctx, t, "strand: flag stranded", err)
	}
	t.Stranded = true
	return t, nil
}
