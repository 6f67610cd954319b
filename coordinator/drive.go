package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/transfer"
)

// CallKind names the participant step a Drive asks for.
type CallKind string

// The participant steps of the transfer protocol (docs/transfers.md) a Drive asks for.
const (
	// CallDebit is step 2 at the source.
	CallDebit CallKind = "debit"
	// CallRefuseDebit cancels a requested transfer at its source (resolve --refuse).
	CallRefuseDebit CallKind = "refuse-debit"
	// CallCredit is step 4 at the destination (after the sale's terms are put there).
	CallCredit CallKind = "credit"
	// CallRefuse tombstones a pending transfer at its destination (resolve --refuse).
	CallRefuse CallKind = "refuse"
	// CallRestore returns a refused transfer's units at its source.
	CallRestore CallKind = "restore"
	// CallSettle records at the source that the destination credited the transfer.
	CallSettle CallKind = "settle"
)

// Call is one participant request a Drive emits: the step, the region that answers it, the
// coordinator generation it carries (the region fences on it: I4) and the transfer.
type Call struct {
	Kind       CallKind
	Region     string
	Generation int64
	Transfer   transfer.Transfer
}

// Reply is a participant's answer to a Call: the source's record (Out) for a debit, a
// refused debit, a restore or a settle; the destination's (In) for a credit or a refuse; or
// Err when no answer came or the region refused the request. An error decides nothing.
type Reply struct {
	Out transfer.OutState
	In  transfer.InState
	Err error
}

// Ledger is the driver's ledger database: transactions of fenced writes, and one
// transfer's row. Production runs it on SQL; the simulation on its durable image, with the
// same semantics.
type Ledger interface {
	// Tx runs fn in one transaction: every write in it commits, or none when fn fails. It
	// may run fn again (a retried serialization failure).
	Tx(ctx context.Context, fn func(LedgerTx) error) error
	// Transfer reads one transfer's current row.
	Transfer(ctx context.Context, id string) (transfer.Transfer, error)
}

// LedgerTx is the statements of one ledger transaction, each as the SQL does it.
type LedgerTx interface {
	// CheckFence passes the ledger's generation fence: it raises the fence to gen, or
	// answers ErrFenced when a higher generation has written (I4).
	CheckFence(gen int64) error
	// AddUnallocated adds delta to a SKU's unallocated units unless they would fall below
	// zero (I2); false when they would (nothing changed).
	AddUnallocated(sale, sku string, delta transfer.Units) (bool, error)
	// SetState moves transfer id from state from to next, clearing the stranded flag and
	// recording reason, settled and now; false when it was not in from (nothing changed).
	SetState(id string, from, next transfer.State, reason string, settled bool, now time.Time) (bool, error)
	// SetReason records why an unfinished (requested or pending) transfer waits.
	SetReason(id, reason string, now time.Time) error
	// Strand flags an unfinished transfer stranded, with its reason.
	Strand(id, reason string, now time.Time) error
	// SetSettled marks a posted transfer settled at its source.
	SetSettled(id string) error
}

// DriveConfig is what a Drive needs besides its transfer: the seams production fills with
// SQL, its region links and the wall clock, and the simulation with its own.
type DriveConfig struct {
	Ledger Ledger
	// Link reports why a region cannot be asked (not configured); nil: every region can.
	Link        func(region string) error
	Clock       clock.Clock
	StrandAfter time.Duration
	Logger      *slog.Logger
}

// phase is the call a Drive waits for the answer to.
type phase int

const (
	phNone phase = iota
	phDebit
	phCredit
	phRestore
	phSettle
	phRefuseDebit
	phRefuse
)

// mode is what a Drive does with an unfinished transfer before driving it forward.
type mode int

const (
	modeDrive     mode = iota
	modeRefuseOut      // resolve --refuse of a requested transfer: refuse the debit at the source
	modeRefuseIn       // resolve --refuse of a pending transfer: refuse at the destination
)

// Drive is the transfer driver (docs/transfers.md, "The protocol") as a deterministic state machine: it takes a
// transfer's ledger row, emits the participant calls one at a time, consumes each reply,
// and makes the ledger writes (fenced, I4) itself through its Ledger. It never decides an
// outcome a participant has not recorded: an error or an answer that decides nothing
// leaves the transfer where it is, flagged stranded once it has been unfinished longer than
// StrandAfter, and ends the drive. It holds no goroutine, timer or connection: production
// runs it with blocking gRPC calls (Coordinator.drive), the simulation with its network.
type Drive struct {
	cfg    DriveConfig
	gen    int64
	t      transfer.Transfer
	mode   mode
	phase  phase
	resolv bool // the drive is a resolve's: it ends once the transfer is voided by an abort
	done   bool
	err    error
}

// NewDrive starts driving transfer t (as the ledger has it) with generation gen. With
// refuse it is `resolve --refuse`: a requested transfer is first refused at its source and
// a pending one at its destination, and driven on only if that comes too late.
func NewDrive(cfg DriveConfig, gen int64, t transfer.Transfer, refuse bool) *Drive {
	d := &Drive{cfg: cfg, gen: gen, t: t, resolv: refuse}
	switch {
	case refuse && t.State == transfer.Requested:
		d.mode = modeRefuseOut
	case refuse && t.State == transfer.Pending && t.To != transfer.Unallocated:
		d.mode = modeRefuseIn
	}
	return d
}

// Start returns the first call to make, or false when the drive ended without one.
func (d *Drive) Start(ctx context.Context) (Call, bool) { return d.next(ctx) }

// Reply consumes the answer to the last call and returns the next call, or false when the
// drive has ended.
func (d *Drive) Reply(ctx context.Context, r Reply) (Call, bool) {
	if d.done || d.phase == phNone {
		panic(fmt.Sprintf("coordinator: reply to transfer %s's drive with no call out", d.t.ID))
	}
	ph := d.phase
	d.phase = phNone
	switch ph {
	case phDebit:
		d.onDebit(ctx, r, fmt.Sprintf("source %s refused the debit: it had fewer than %d available, or the transfer was cancelled", d.t.From, d.t.Units))
	case phCredit:
		if call, ok := d.onCredit(ctx, r); ok {
			return call, true
		}
	case phRestore:
		d.onRestore(ctx, r)
	case phSettle:
		d.onSettle(ctx, r)
	case phRefuseDebit:
		d.onRefuseDebit(ctx, r)
	case phRefuse:
		if call, ok := d.onRefuse(ctx, r); ok {
			return call, true
		}
	}
	return d.next(ctx)
}

// Result is the transfer as the drive leaves it, and the error that ended it: a ledger write
// that failed while stranding or settling it (ErrFenced to errors.Is when a newer
// coordinator leads), or a region that is not configured; nil otherwise (an unfinished,
// possibly stranded transfer is not an error). With an error the transfer is not stranded
// and not settled: it is where the ledger has it.
func (d *Drive) Result() (transfer.Transfer, error) { return d.t, d.err }

func (d *Drive) finish(err error) { d.done, d.err = true, err }

// ask emits call kind to region, to be answered through Reply.
func (d *Drive) ask(kind CallKind, region string, ph phase) (Call, bool) {
	d.phase = ph
	return Call{Kind: kind, Region: region, Generation: d.gen, Transfer: d.t}, true
}

func (d *Drive) link(region string) error {
	if d.cfg.Link == nil {
		return nil
	}
	return d.cfg.Link(region)
}

// next takes the transfer on from its ledger state until a call must be made or the drive
// ends.
func (d *Drive) next(ctx context.Context) (Call, bool) {
	for !d.done {
		var call Call
		var ok bool
		switch {
		case d.mode == modeRefuseOut:
			call, ok = d.refuseOut(ctx)
		case d.mode == modeRefuseIn:
			call, ok = d.refuseIn()
		case !d.t.State.Final():
			call, ok = d.step(ctx)
		case d.t.State == transfer.Posted && !d.t.Settled:
			call, ok = d.settle(ctx)
		default:
			d.finish(nil)
		}
		if ok {
			return call, true
		}
	}
	return Call{}, false
}

// step asks for the next protocol step of an unfinished transfer; a step the ledger takes
// itself (the unallocated pool's debit or credit) is recorded at once.
func (d *Drive) step(ctx context.Context) (Call, bool) {
	t := d.t
	switch t.State {
	case transfer.Requested:
		if t.From == transfer.Unallocated { // the ledger's own debit: on requested → pending
			d.recordDebit(ctx, transfer.OutPending, "")
			return Call{}, false
		}
		if err := d.link(t.From); err != nil {
			d.strand(ctx, fmt.Errorf("debit at %s: %w", t.From, err).Error())
			return Call{}, false
		}
		return d.ask(CallDebit, t.From, phDebit)
	case transfer.Pending:
		if t.To == transfer.Unallocated { // the ledger's own credit: on pending → posted
			return d.afterCredit(ctx, transfer.InCredited)
		}
		if err := d.link(t.To); err != nil {
			d.strand(ctx, fmt.Errorf("credit at %s: %w", t.To, err).Error())
			return Call{}, false
		}
		return d.ask(CallCredit, t.To, phCredit)
	}
	panic(fmt.Sprintf("coordinator: step of transfer %s in state %s", t.ID, t.State))
}

func (d *Drive) onDebit(ctx context.Context, r Reply, refused string) {
	if r.Err != nil {
		d.strand(ctx, fmt.Errorf("debit at %s: %w", d.t.From, r.Err).Error())
		return
	}
	d.recordDebit(ctx, r.Out, refused)
}

// recordDebit moves a requested transfer as the source's record says (its answer to a Debit
// or a RefuseDebit): debited → pending (I1: the units are in flight), refused → voided with
// the reason given (nothing left the source). Any other answer decides nothing: stranded.
func (d *Drive) recordDebit(ctx context.Context, st transfer.OutState, refused string) {
	ev, err := transfer.AfterDebit(st)
	if err != nil {
		d.strand(ctx, fmt.Errorf("at %s: %w", d.t.From, err).Error()) // never guess
		return
	}
	if ev == transfer.Aborted {
		d.advanceOrStrand(ctx, transfer.Aborted, refused)
		return
	}
	d.advanceOrStrand(ctx, transfer.Debited, "")
}

// onCredit reads the destination's answer to step 4. No answer decides nothing (stranded:
// the destination may have credited, so the source is never restored on a guess, I5).
func (d *Drive) onCredit(ctx context.Context, r Reply) (Call, bool) {
	if r.Err != nil {
		d.strand(ctx, fmt.Errorf("credit at %s: %w", d.t.To, r.Err).Error())
		return Call{}, false
	}
	return d.afterCredit(ctx, r.In)
}

// afterCredit posts a credited transfer (I1: in flight → the destination's pool) and aborts
// a refused one.
func (d *Drive) afterCredit(ctx context.Context, st transfer.InState) (Call, bool) {
	ev, err := transfer.AfterCredit(st)
	if err != nil {
		d.strand(ctx, fmt.Errorf("at %s: %w", d.t.To, err).Error()) // never guess
		return Call{}, false
	}
	if ev == transfer.Refused {
		return d.abort(ctx)
	}
	d.advanceOrStrand(ctx, transfer.Credited, "")
	return Call{}, false
}

// abort finishes a transfer the destination has durably refused: the source restores the
// units (never before that refusal: I5), then the ledger voids it (I1: in flight → the
// source's pool, or the unallocated pool in the same write).
func (d *Drive) abort(ctx context.Context) (Call, bool) {
	if d.t.From != transfer.Unallocated {
		if err := d.link(d.t.From); err != nil {
			d.strand(ctx, err.Error())
			return Call{}, false
		}
		return d.ask(CallRestore, d.t.From, phRestore)
	}
	d.voidRefused(ctx)
	return Call{}, false
}

func (d *Drive) onRestore(ctx context.Context, r Reply) {
	if r.Err != nil {
		d.strand(ctx, fmt.Errorf("restore at %s: %w", d.t.From, r.Err).Error())
		return
	}
	d.voidRefused(ctx)
}

// voidRefused records the destination's refusal, the source restored (pending → voided;
// I1: in flight → the source's pool; I5: restored once, never credited). A resolve's drive
// ends there.
func (d *Drive) voidRefused(ctx context.Context) {
	d.advanceOrStrand(ctx, transfer.Refused, fmt.Sprintf("refused by %s", d.t.To))
	if d.resolv && !d.done {
		d.finish(nil)
	}
}

// settle asks a posted transfer's source to record that it was credited (bookkeeping only).
func (d *Drive) settle(ctx context.Context) (Call, bool) {
	if err := d.link(d.t.From); err != nil {
		d.finish(d.stepFailed(ctx, "settle: source", err))
		return Call{}, false
	}
	return d.ask(CallSettle, d.t.From, phSettle)
}

// onSettle marks the transfer settled in the ledger once its source has recorded it
// (bookkeeping: no count moves, so I1 holds; fenced, I4). A
// source that does not answer leaves it unsettled, to be asked again (not an error); a
// failed ledger write is.
func (d *Drive) onSettle(ctx context.Context, r Reply) {
	if r.Err != nil {
		d.cfg.Logger.Warn("settle transfer", "transfer", d.t.ID, "step", "settle at source", "err", r.Err)
		d.finish(nil)
		return
	}
	id := d.t.ID
	if err := d.fencedTx(ctx, func(tx LedgerTx) error { return tx.SetSettled(id) }); err != nil {
		d.finish(d.stepFailed(ctx, "settle: record settled", err))
		return
	}
	d.t.Settled = true
	d.finish(nil)
}

// refuseOut is resolve --refuse of a requested transfer: the abort of the transfer protocol (docs/transfers.md), taken
// at the source because nothing has reached the destination. From the unallocated pool
// the ledger voids it itself (its debit happens on requested → pending).
func (d *Drive) refuseOut(ctx context.Context) (Call, bool) {
	if d.t.From == transfer.Unallocated {
		d.advanceOrStrand(ctx, transfer.Aborted, "cancelled before the unallocated pool was debited")
		d.afterRefuseOut()
		return Call{}, false
	}
	if err := d.link(d.t.From); err != nil {
		d.strand(ctx, err.Error())
		return Call{}, false
	}
	return d.ask(CallRefuseDebit, d.t.From, phRefuseDebit)
}

// onRefuseDebit records the source's answer: a refused tombstone voids the transfer
// (requested → voided; I1: the units never left the source, I5: no later debit can apply);
// a debit that came first is recorded instead (requested → pending) and the transfer is
// refused at the destination next. With no answer it stays requested: the source alone
// knows whether it debited.
func (d *Drive) onRefuseDebit(ctx context.Context, r Reply) {
	if r.Err != nil {
		d.strand(ctx, fmt.Errorf("refuse debit at %s: %w", d.t.From, r.Err).Error())
		return
	}
	d.recordDebit(ctx, r.Out, fmt.Sprintf("cancelled: %s refused the debit", d.t.From))
	d.afterRefuseOut()
}

func (d *Drive) afterRefuseOut() {
	switch {
	case d.done:
	case d.t.State != transfer.Pending:
		d.finish(nil)
	case d.t.To != transfer.Unallocated:
		d.mode = modeRefuseIn // the source had debited first: the units are in flight
	default:
		d.mode = modeDrive
	}
}

// refuseIn asks the destination of a pending transfer to refuse it (a tombstone unless it
// already credited).
func (d *Drive) refuseIn() (Call, bool) {
	if err := d.link(d.t.To); err != nil {
		d.finish(err)
		return Call{}, false
	}
	return d.ask(CallRefuse, d.t.To, phRefuse)
}

// onRefuse aborts a transfer the destination refused (source restored, then voided); one it
// had already credited is driven on as any other.
func (d *Drive) onRefuse(ctx context.Context, r Reply) (Call, bool) {
	if r.Err != nil {
		d.strand(ctx, fmt.Sprintf("refuse at %s: %v", d.t.To, r.Err))
		return Call{}, false
	}
	d.mode = modeDrive
	if r.In == transfer.InRefused {
		return d.abort(ctx)
	}
	return Call{}, false
}

// advanceOrStrand records event e; a write that fails leaves the transfer as it was,
// stranded if that lasts.
func (d *Drive) advanceOrStrand(ctx context.Context, e transfer.Event, reason string) {
	t, err := d.advance(ctx, e, reason)
	if err != nil {
		d.strand(ctx, err.Error())
		return
	}
	d.t = t
}

// fencedTx runs fn in a ledger transaction that first passes the generation fence (I4).
func (d *Drive) fencedTx(ctx context.Context, fn func(LedgerTx) error) error {
	return d.cfg.Ledger.Tx(ctx, func(tx LedgerTx) error {
		if err := tx.CheckFence(d.gen); err != nil {
			return err
		}
		return fn(tx)
	})
}

// advance records event e in the ledger, fenced (I4) and guarded on the state it read, with
// the unallocated pool's side of it in the same transaction: requested → pending from the
// pool takes its units (aborting when it has too few), pending → posted into the pool adds
// them, pending → voided from the pool restores them. Each preserves I1 (and I2: the pool
// never goes negative); the fence keeps a deposed coordinator from writing (I4). When
// another driver moved the transfer first, it answers the ledger's row.
func (d *Drive) advance(ctx context.Context, e transfer.Event, reason string) (transfer.Transfer, error) {
	t := d.t
	// An answer the transition table does not allow is a programmer error: Must panics.
	next := transfer.Must(transfer.Next(t.State, e))
	now := d.cfg.Clock.Now()
	reason0 := reason
	err := d.fencedTx(ctx, func(tx LedgerTx) error {
		next, reason = transfer.Must(transfer.Next(t.State, e)), reason0 // reset: the closure may run again
		if delta := unallocatedDelta(t, next); delta != 0 {
			ok, err := tx.AddUnallocated(t.Sale, t.SKU, delta)
			if err != nil {
				return err
			}
			if !ok { // the pool has too few: the debit is refused instead
				next, reason = transfer.Voided, fmt.Sprintf("unallocated pool had fewer than %d", t.Units)
			}
		}
		settled := t.From == transfer.Unallocated || next != transfer.Posted
		ok, err := tx.SetState(t.ID, t.State, next, reason, settled, now)
		if err != nil {
			return err
		}
		if !ok {
			return errLedgerMoved
		}
		return nil
	})
	if errors.Is(err, errLedgerMoved) {
		return d.cfg.Ledger.Transfer(ctx, t.ID)
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

// strand ends a drive whose step had no answer (or one that decides nothing): the units
// stay where the protocol left them (in flight when pending), out of circulation and
// visible, until the participant answers; nothing is reassigned on a timeout (I1, I5).
// Once the transfer has been unfinished for StrandAfter it is flagged stranded; before,
// only the reason is recorded, when it changed. A failed write of either ends the drive with
// the error (ErrFenced to errors.Is when a newer coordinator leads), the ledger row left as
// it was and the transfer not stranded.
func (d *Drive) strand(ctx context.Context, reason string) {
	if ctx.Err() != nil {
		d.finish(nil)
		return
	}
	t := d.t
	d.cfg.Logger.Warn("transfer not finished", "transfer", t.ID, "state", t.State, "reason", reason)
	stored := t.Reason
	d.t.Reason = reason
	if t.Stranded || d.cfg.Clock.Now().Sub(t.CreatedAt) < d.cfg.StrandAfter {
		if reason == stored { // shown by transfers list before the flag; written when it changes
			d.finish(nil)
			return
		}
		err := d.fencedTx(ctx, func(tx LedgerTx) error { return tx.SetReason(t.ID, reason, d.cfg.Clock.Now()) })
		if err != nil {
			d.finish(d.stepFailed(ctx, "strand: record reason", err))
			return
		}
		d.finish(nil)
		return
	}
	err := d.fencedTx(ctx, func(tx LedgerTx) error { return tx.Strand(t.ID, reason, d.cfg.Clock.Now()) })
	if err != nil {
		d.finish(d.stepFailed(ctx, "strand: flag stranded", err))
		return
	}
	d.t.Stranded = true
	d.finish(nil)
}

// stepFailed logs a step of the transfer that failed (quietly when ctx ended: the
// coordinator is stepping down) and returns its error wrapped with the transfer and the
// step. A fenced write (a newer coordinator leads) stays ErrFenced to errors.Is, and is
// logged as fenced.
func (d *Drive) stepFailed(ctx context.Context, step string, err error) error {
	level := slog.LevelWarn
	if ctx.Err() != nil {
		level = slog.LevelDebug
	}
	d.cfg.Logger.Log(ctx, level, "transfer step failed", "transfer", d.t.ID, "step", step,
		"fenced", errors.Is(err, ErrFenced), "err", err)
	return fmt.Errorf("transfer %s: %s: %w", d.t.ID, step, err)
}
