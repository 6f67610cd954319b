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

// transferDriver runs the Drive state machine (drive.go) against the regions and the
// SQL ledger (ledgersql.go): once for each transfer a caller starts or resolves, and every
// RetryInterval for every unfinished transfer while this coordinator leads (loop).
type transferDriver struct {
	cfg     *Config
	ledger  *ledger
	regions *regionSet
}

// loop drives every unfinished transfer again every RetryInterval while this
// coordinator leads: after a restart or a change of leader, nothing is left half done.
func (dr *transferDriver) loop(ctx context.Context, gen int64) {
	every(ctx, dr.cfg.RetryInterval, func() {
		if err := dr.unfinished(ctx, gen); err != nil {
			// Each failure was logged at Warn where it happened, with its transfer and step.
			dr.cfg.Logger.Debug("drive unfinished transfers: round incomplete", "err", err)
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

// unfinished is one round of loop: it drives every unfinished transfer once, in
// the order they were created. A transfer whose ledger write fails does not stop the round;
// the round returns every such error joined (each logged with its transfer and step where
// it happened; errors.Is finds ErrFenced among them), or the failure to list the transfers.
func (dr *transferDriver) unfinished(ctx context.Context, gen int64) error {
	rows, err := dr.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE state IN ('requested', 'pending') OR (state = 'posted' AND NOT settled) ORDER BY created_at`)
	if err != nil {
		return dr.roundFailed(ctx, "list unfinished transfers", err)
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil {
		return dr.roundFailed(ctx, "scan unfinished transfers", err)
	}
	var errs []error
	for _, t := range ts {
		if ctx.Err() != nil {
			break
		}
		if _, err := dr.drive(ctx, gen, t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// roundFailed logs an unfinished round that could not read its transfers (quietly when
// ctx ended: the coordinator is stepping down) and returns the error wrapped with its step.
func (dr *transferDriver) roundFailed(ctx context.Context, step string, err error) error {
	level := slog.LevelWarn
	if ctx.Err() != nil {
		level = slog.LevelDebug
	}
	dr.cfg.Logger.Log(ctx, level, step, "step", step, "err", err)
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
func (dr *transferDriver) drive(ctx context.Context, gen int64, t transfer.Transfer) (transfer.Transfer, error) {
	return dr.run(ctx, NewDrive(dr.config(), gen, t, false))
}

// run is the goroutine shell of a Drive: it makes each call the drive emits, blocking, and
// hands the drive its reply, until the drive ends.
func (dr *transferDriver) run(ctx context.Context, d *Drive) (transfer.Transfer, error) {
	call, ok := d.Start(ctx)
	for ok {
		call, ok = d.Reply(ctx, dr.call(ctx, call))
	}
	return d.Result()
}

// config fills a Drive's seams in production: the SQL ledger, the configured region
// links, the coordinator's clock and logger.
func (dr *transferDriver) config() DriveConfig {
	return DriveConfig{
		Ledger:      sqlLedger{dr.ledger},
		Link:        func(region string) error { _, err := dr.regions.link(region); return err },
		Clock:       dr.cfg.Clock,
		StrandAfter: dr.cfg.StrandAfter,
		Logger:      dr.cfg.Logger,
	}
}

// call makes one participant call of a Drive, bounded by CallTimeout.
func (dr *transferDriver) call(ctx context.Context, call Call) Reply {
	l, err := dr.regions.link(call.Region)
	if err != nil {
		return Reply{Err: err}
	}
	p, gen, t := l.Participant, call.Generation, call.Transfer
	if call.Kind == CallCredit {
		return dr.credit(ctx, p, gen, t)
	}
	cctx, cancel := context.WithTimeout(ctx, dr.cfg.CallTimeout)
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
func (dr *transferDriver) credit(ctx context.Context, p Participant, gen int64, t transfer.Transfer) Reply {
	sale, err := dr.ledger.sale(ctx, t.Sale)
	if err != nil {
		return Reply{Err: err}
	}
	cctx, cancel := context.WithTimeout(ctx, dr.cfg.CallTimeout)
	defer cancel()
	if err := p.PutSale(cctx, gen, sale.Terms); err != nil {
		return Reply{Err: fmt.Errorf("put sale: %w", err)}
	}
	st, err := p.Credit(cctx, gen, t)
	return Reply{In: st, Err: err}
}
