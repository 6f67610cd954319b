package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/transfer"
)

// memLedger is a Drive's ledger in memory, with the SQL's semantics: a failed transaction
// changes nothing, the fence refuses a lower generation.
type memLedger struct {
	fence       int64
	unallocated transfer.Units
	rows        map[string]transfer.Transfer
}

func (l *memLedger) Tx(_ context.Context, fn func(LedgerTx) error) error {
	fence, unalloc, rows := l.fence, l.unallocated, maps.Clone(l.rows)
	if err := fn(memTx{l}); err != nil {
		l.fence, l.unallocated, l.rows = fence, unalloc, rows
		return err
	}
	return nil
}

func (l *memLedger) Transfer(_ context.Context, id string) (transfer.Transfer, error) {
	t, ok := l.rows[id]
	if !ok {
		return t, fmt.Errorf("transfer %s: %w", id, ErrNotFound)
	}
	return t, nil
}

type memTx struct{ l *memLedger }

func (x memTx) CheckFence(gen int64) error {
	next, err := transfer.Admit(x.l.fence, gen)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	x.l.fence = next
	return nil
}

func (x memTx) AddUnallocated(_, _ string, delta transfer.Units) (bool, error) {
	if x.l.unallocated+delta < 0 {
		return false, nil
	}
	x.l.unallocated += delta
	return true, nil
}

func (x memTx) SetState(id string, from, next transfer.State, reason string, settled bool, _ time.Time) (bool, error) {
	t := x.l.rows[id]
	if t.State != from {
		return false, nil
	}
	t.State, t.Stranded, t.Reason, t.Settled = next, false, reason, settled
	x.l.rows[id] = t
	return true, nil
}

func (x memTx) SetReason(id, reason string, _ time.Time) error {
	t := x.l.rows[id]
	t.Reason = reason
	x.l.rows[id] = t
	return nil
}

func (x memTx) Strand(id, reason string, _ time.Time) error {
	t := x.l.rows[id]
	t.Stranded, t.Reason = true, reason
	x.l.rows[id] = t
	return nil
}

func (x memTx) SetSettled(id string) error {
	t := x.l.rows[id]
	t.Settled = true
	x.l.rows[id] = t
	return nil
}

// driveCase is a pending transfer of 5 units us → eu, created at the clock's start.
func driveCase(fence int64) (*memLedger, *clock.Manual, DriveConfig, transfer.Transfer) {
	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t := transfer.Transfer{ID: "t1", Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 5,
		State: transfer.Pending, CreatedAt: clk.Now()}
	l := &memLedger{fence: fence, rows: map[string]transfer.Transfer{"t1": t}}
	cfg := DriveConfig{Ledger: l, Clock: clk, StrandAfter: time.Minute, Logger: slog.New(slog.DiscardHandler)}
	return l, clk, cfg, t
}

// script runs a drive, answering each call it emits with the reply given for its kind,
// and returns the calls in order.
func script(t *testing.T, d *Drive, replies map[CallKind]Reply) []CallKind {
	t.Helper()
	var kinds []CallKind
	ctx := context.Background()
	call, ok := d.Start(ctx)
	for ok {
		kinds = append(kinds, call.Kind)
		if len(kinds) > 10 {
			t.Fatalf("the drive goes on: %v", kinds)
		}
		r, known := replies[call.Kind]
		if !known {
			t.Fatalf("unexpected call %s (calls so far %v)", call.Kind, kinds)
		}
		call, ok = d.Reply(ctx, r)
	}
	return kinds
}

// TestDriveNeverRestoresOnALostCreditReply: a Credit with no answer decides nothing (the
// destination may have credited): the transfer stays pending with the reason, no Restore is
// asked (I5), and once it is older than StrandAfter it is flagged stranded.
func TestDriveNeverRestoresOnALostCreditReply(t *testing.T) {
	l, clk, cfg, tr := driveCase(1)
	lost := map[CallKind]Reply{CallCredit: {Err: context.DeadlineExceeded}}
	if calls := script(t, NewDrive(cfg, 1, tr, false), lost); fmt.Sprint(calls) != "[credit]" {
		t.Fatalf("calls %v, want only the credit", calls)
	}
	row := l.rows["t1"]
	if row.State != transfer.Pending || row.Stranded || !strings.HasPrefix(row.Reason, "credit at eu: ") {
		t.Fatalf("after a lost credit reply: %+v; want pending, not stranded, the reason recorded", row)
	}
	clk.Advance(2 * time.Minute)
	script(t, NewDrive(cfg, 1, row, false), lost)
	if row := l.rows["t1"]; row.State != transfer.Pending || !row.Stranded {
		t.Fatalf("after StrandAfter: %+v; want pending and stranded", row)
	}
}

// TestDriveRestoresOnlyAfterTheRefusal: the source is asked to restore only once the
// destination answered refused, and the ledger voids the transfer after the restore; a
// credited answer posts and settles it.
func TestDriveRestoresOnlyAfterTheRefusal(t *testing.T) {
	l, _, cfg, tr := driveCase(1)
	calls := script(t, NewDrive(cfg, 1, tr, false), map[CallKind]Reply{
		CallCredit: {In: transfer.InRefused}, CallRestore: {Out: transfer.OutVoided}})
	if fmt.Sprint(calls) != "[credit restore]" || l.rows["t1"].State != transfer.Voided || l.rows["t1"].Reason != "refused by eu" {
		t.Fatalf("refused: calls %v, row %+v; want credit then restore, voided", calls, l.rows["t1"])
	}
	l, _, cfg, tr = driveCase(1)
	calls = script(t, NewDrive(cfg, 1, tr, false), map[CallKind]Reply{
		CallCredit: {In: transfer.InCredited}, CallSettle: {Out: transfer.OutSettled}})
	if fmt.Sprint(calls) != "[credit settle]" || l.rows["t1"].State != transfer.Posted || !l.rows["t1"].Settled {
		t.Fatalf("credited: calls %v, row %+v; want credit then settle, posted and settled", calls, l.rows["t1"])
	}
	// resolve --refuse meeting a destination that had credited: no restore, driven on.
	l, _, cfg, tr = driveCase(1)
	calls = script(t, NewDrive(cfg, 1, tr, true), map[CallKind]Reply{
		CallRefuse: {In: transfer.InCredited}, CallCredit: {In: transfer.InCredited}, CallSettle: {Out: transfer.OutSettled}})
	if fmt.Sprint(calls) != "[refuse credit settle]" || l.rows["t1"].State != transfer.Posted {
		t.Fatalf("refuse too late: calls %v, row %+v; want refuse, credit, settle, posted", calls, l.rows["t1"])
	}
}

// TestDriveFencedWritesChangeNothing: a drive of a deposed coordinator (its generation below
// the ledger's fence) writes nothing, whatever the participants answer, and ends with
// ErrFenced (I4).
func TestDriveFencedWritesChangeNothing(t *testing.T) {
	l, _, cfg, tr := driveCase(2)
	d := NewDrive(cfg, 1, tr, false)
	script(t, d, map[CallKind]Reply{CallCredit: {In: transfer.InCredited}})
	got, err := d.Result()
	if !errors.Is(err, ErrFenced) || got.Stranded || got.State != transfer.Pending {
		t.Fatalf("deposed drive: %+v, %v; want the transfer pending, ErrFenced", got, err)
	}
	if row := l.rows["t1"]; row != tr || l.fence != 2 {
		t.Fatalf("ledger %+v (fence %d) after a fenced drive; want %+v untouched, fence 2", row, l.fence, tr)
	}
}
