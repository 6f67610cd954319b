package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/pgutil"
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

// drive takes a transfer as far as the participants' answers allow (docs/transfers.md) and
// returns its ledger state afterwards: it runs a Drive, making each call it emits to the
// region's participant in turn, bounded by CallTimeout. Every step is idempotent by
// transfer id, so a lost reply is resolved by asking again. It never decides an outcome a
// participant has not recorded: no answer leaves the transfer where it is, flagged stranded
// once it has been unfinished longer than StrandAfter; that is not an error. A ledger write
// that fails while stranding or settling it is (ErrFenced to errors.Is when a newer
// coordinator leads), and the transfer returned with it is not stranded, not settled, in
// the state the ledger has.
func (c *Coordinator) drive(ctx context.Context, gen int64, t transfer.Transfer) (transfer.Transfer, error) {
	return c.run(ctx, NewDrive(c.driveConfig(), gen, t, false))
}

// run is the goroutine shell of a Drive: it makes each call the drive emits, blocking, and
// hands the drive its reply, until the drive ends.
func (c *Coordinator) run(ctx context.Context, d *Drive) (transfer.Transfer, error) {
	call, ok := d.Start(ctx)
	for ok {
		call, ok = d.Reply(ctx, c.call(ctx, call))
	}
	return d.Result()
}

// driveConfig fills a Drive's seams in production: the SQL ledger, the configured region
// links, the coordinator's clock and logger.
func (c *Coordinator) driveConfig() DriveConfig {
	return DriveConfig{
		Ledger:      sqlLedger{c},
		Link:        func(region string) error { _, err := c.link(region); return err },
		Clock:       c.cfg.Clock,
		StrandAfter: c.cfg.StrandAfter,
		Logger:      c.cfg.Logger,
	}
}

func (c *Coordinator) link(region string) (RegionLink, error) {
	l, ok := c.regions[region]
	if !ok {
		return l, fmt.Errorf("region %q is not configured", region)
	}
	return l, nil
}

// call makes one participant call of a Drive, bounded by CallTimeout.
func (c *Coordinator) call(ctx context.Context, call Call) Reply {
	l, err := c.link(call.Region)
	if err != nil {
		return Reply{Err: err}
	}
	p, gen, t := l.Participant, call.Generation, call.Transfer
	if call.Kind == CallCredit {
		return c.credit(ctx, p, gen, t)
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	var r Reply
	switch call.Kind {
	case CallDebit:
		r.Out, r.Err = p.Debit(cctx, gen, t)
	case CallRefuseDebit:
		r.Out, r.Err = p.RefuseDebit(cctx, gen, t)
	case CallRefuse:
		r.In, r.Err = p.Refuse(cctx, gen, t)
	case CallRestore:
		r.Out, r.Err = p.Restore(cctx, gen, t)
	case CallSettle:
		r.Out, r.Err = p.Settle(cctx, gen, t)
	default:
		panic(fmt.Sprintf("coordinator: drive of transfer %s asked for %q", t.ID, call.Kind))
	}
	return r
}

// credit is step 4 at the destination: the sale's terms first (the region may not know
// the sale yet), then the credit, within one CallTimeout.
func (c *Coordinator) credit(ctx context.Context, p Participant, gen int64, t transfer.Transfer) Reply {
	sale, err := c.GetSale(ctx, t.Sale)
	if err != nil {
		return Reply{Err: err}
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	if err := p.PutSale(cctx, gen, sale.Terms); err != nil {
		return Reply{Err: fmt.Errorf("put sale: %w", err)}
	}
	st, err := p.Credit(cctx, gen, t)
	return Reply{In: st, Err: err}
}

// sqlLedger is a Drive's ledger in production: the coordinator's SQL database.
type sqlLedger struct{ c *Coordinator }

// Tx runs fn in one SQL transaction (retried on a serialization failure).
func (l sqlLedger) Tx(ctx context.Context, fn func(LedgerTx) error) error {
	return pgutil.Tx(ctx, l.c.db, func(tx pgx.Tx) error { return fn(sqlLedgerTx{ctx, l.c, tx}) })
}

// Transfer reads a transfer's current ledger row (another driver finished the step first).
func (l sqlLedger) Transfer(ctx context.Context, id string) (transfer.Transfer, error) {
	rows, err := l.c.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE transfer_id = $1`, id)
	if err != nil {
		return transfer.Transfer{}, err
	}
	return pgx.CollectExactlyOneRow(rows, scanTransfer)
}

// sqlLedgerTx is the statements of one ledger transaction in SQL.
type sqlLedgerTx struct {
	ctx context.Context
	c   *Coordinator
	tx  pgx.Tx
}

// CheckFence passes the ledger's generation fence (I4), counting a refusal.
func (x sqlLedgerTx) CheckFence(gen int64) error { return x.c.checkFence(x.ctx, x.tx, gen) }

// AddUnallocated is a conditional update: unallocated never falls below zero (I2).
func (x sqlLedgerTx) AddUnallocated(sale, sku string, delta transfer.Units) (bool, error) {
	tag, err := x.tx.Exec(x.ctx, `UPDATE skus SET unallocated = unallocated + $3 WHERE sale_id = $1 AND sku = $2 AND unallocated + $3 >= 0`,
		sale, sku, int64(delta))
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() != 0, nil
}

// SetState moves a transfer guarded on the state it was read in.
func (x sqlLedgerTx) SetState(id string, from, next transfer.State, reason string, settled bool, now time.Time) (bool, error) {
	tag, err := x.tx.Exec(x.ctx, `UPDATE transfers SET state = $2, stranded = false, reason = $3, settled = $4, updated_at = $5
			WHERE transfer_id = $1 AND state = $6`, id, string(next), reason, settled, now, string(from))
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() != 0, nil
}

// SetReason records why an unfinished transfer waits.
func (x sqlLedgerTx) SetReason(id, reason string, now time.Time) error {
	_, err := x.tx.Exec(x.ctx, `UPDATE transfers SET reason = $2, updated_at = $3
				WHERE transfer_id = $1 AND state IN ('requested', 'pending')`, id, reason, now)
	return err
}

// Strand flags an unfinished transfer stranded.
func (x sqlLedgerTx) Strand(id, reason string, now time.Time) error {
	_, err := x.tx.Exec(x.ctx, `UPDATE transfers SET stranded = true, reason = $2, updated_at = $3
			WHERE transfer_id = $1 AND state IN ('requested', 'pending')`, id, reason, now)
	return err
}

// SetSettled marks a posted transfer settled.
func (x sqlLedgerTx) SetSettled(id string) error {
	_, err := x.tx.Exec(x.ctx, `UPDATE transfers SET settled = true WHERE transfer_id = $1`, id)
	return err
}
