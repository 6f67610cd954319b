package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/quotaworks/quota/transfer"
)

// CheckSaleGeneration raises the region's fence for sale to gen, in the caller's
// transaction, or returns ErrFenced when a higher generation was already seen. Every
// region write that comes from the coordinator calls it first (I4: fences only rise), so a
// deposed coordinator's late request changes nothing: the whole transaction is rolled back.
func CheckSaleGeneration(ctx context.Context, tx pgx.Tx, sale string, gen int64) error {
	var highest int64
	err := tx.QueryRow(ctx, `SELECT generation FROM sale_fences WHERE sale_id = $1 FOR UPDATE`, sale).Scan(&highest)
	if err != nil && err != pgx.ErrNoRows {
		return fmt.Errorf("sale fence: %w", err)
	}
	// The rule itself is transfer.Admit, shared with the deterministic simulation.
	next, err := transfer.Admit(highest, gen)
	if err != nil {
		return fmt.Errorf("sale %s: %w: %w", sale, err, ErrFenced)
	}
	// Conditional as well: with no row yet, FOR UPDATE locked nothing, and a concurrent
	// higher generation may have inserted one since; it must not be lowered.
	var got int64
	err = tx.QueryRow(ctx, `INSERT INTO sale_fences (sale_id, generation) VALUES ($1, $2)
		ON CONFLICT (sale_id) DO UPDATE SET generation = excluded.generation
		WHERE sale_fences.generation <= excluded.generation
		RETURNING generation`, sale, next).Scan(&got)
	if err == pgx.ErrNoRows {
		return fmt.Errorf("sale %s: generation %d is below the highest seen: %w", sale, gen, ErrFenced)
	}
	if err != nil {
		return fmt.Errorf("sale fence: %w", err)
	}
	return nil
}

// CheckLedgerGeneration raises the coordinator ledger's fence to gen in the caller's
// transaction, or returns ErrFenced when a newer coordinator has written (I4). The
// transaction may then idle at most MaxIdleHoldingFence.
func CheckLedgerGeneration(ctx context.Context, tx pgx.Tx, gen int64) error {
	if err := boundIdle(ctx, tx); err != nil {
		return fmt.Errorf("ledger fence: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE ledger_fence SET generation = $1 WHERE id = 1 AND generation <= $1`, gen)
	if err != nil {
		return fmt.Errorf("ledger fence: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("ledger: generation %d is below the current leader's: %w", gen, ErrFenced)
	}
	return nil
}

// RaiseEpoch records epoch as the region's writer epoch. A new leader calls it before it
// loads state or serves, so every batch of the previous leader (which checks its own, lower
// epoch) commits nothing from then on (I4). Raising to the current epoch again is a no-op;
// raising below it is ErrFenced.
func RaiseEpoch(ctx context.Context, tx pgx.Tx, epoch int64) error {
	var got int64
	err := tx.QueryRow(ctx, `
		UPDATE leader_epoch SET epoch = GREATEST(epoch, $1) WHERE id = 1 RETURNING epoch`, epoch).Scan(&got)
	if err != nil {
		return fmt.Errorf("raise epoch: %w", err)
	}
	if got != epoch {
		return fmt.Errorf("epoch %d is below the recorded %d: %w", epoch, got, ErrFenced)
	}
	return nil
}

// MaxIdleHoldingFence is how long PostgreSQL lets a transaction that holds a fence's row lock
// (CheckEpoch, CheckLedgerGeneration) sit idle before it ends the session. A leader that is
// paused (SIGSTOP, a long stall) or cut off in the middle of such a transaction would
// otherwise keep the lock, and its successor's RaiseEpoch would wait for it until TCP gives
// up, hours later. Ending it rolls the transaction back: the paused leader's batch fails
// (it was not acknowledged), and the successor goes on. The writers' transactions send their
// statements back to back, so no healthy one is idle for anything like this long. The
// server's idle timer runs only between queries, not in the middle of a pipeline that has
// not been sent whole: a region's successor ends such a holder itself (region.raiseEpoch).
const MaxIdleHoldingFence = 2 * time.Second

// boundIdle sets MaxIdleHoldingFence for the rest of the caller's transaction.
func boundIdle(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", MaxIdleHoldingFence.Milliseconds()))
	return err
}

// CheckEpoch locks the region's epoch row for the caller's transaction and returns
// ErrFenced unless it still equals epoch (transfer.CurrentEpoch). Every writer batch calls it first: while the
// batch runs, a new leader's RaiseEpoch waits, and once it has committed, this fails. The
// transaction may then idle at most MaxIdleHoldingFence.
func CheckEpoch(ctx context.Context, tx pgx.Tx, epoch int64) error {
	if err := boundIdle(ctx, tx); err != nil {
		return fmt.Errorf("epoch fence: %w", err)
	}
	// The row lock is the one an UPDATE of it takes: RaiseEpoch waits for this transaction.
	var recorded int64
	err := tx.QueryRow(ctx, `SELECT epoch FROM leader_epoch WHERE id = 1 FOR NO KEY UPDATE`).Scan(&recorded)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("writer epoch %d: no epoch recorded: %w", epoch, ErrFenced)
	}
	if err != nil {
		return fmt.Errorf("epoch fence: %w", err)
	}
	// The rule itself is transfer.CurrentEpoch, shared with the deterministic simulation.
	if err := transfer.CurrentEpoch(recorded, epoch); err != nil {
		return fmt.Errorf("%w: %w", err, ErrFenced)
	}
	return nil
}

// epochFencedCode is the SQLSTATE quota_check_epoch raises (region migration 00004).
const epochFencedCode = "QE001"

// QueueEpochCheck queues CheckEpoch's fence as the first statement of a batch sent in one
// round trip: quota_check_epoch takes a share lock on the epoch row (a new leader's
// RaiseEpoch waits for the batch) and fails the batch, and so its implicit transaction,
// unless the region's epoch is still epoch. AsFenced recognizes that failure.
func QueueEpochCheck(b *pgx.Batch, epoch int64) {
	b.Queue(`SELECT quota_check_epoch($1)`, epoch)
}

// AsFenced returns ErrFenced, wrapped with the server's message, when err is the failure of a
// QueueEpochCheck; otherwise nil.
func AsFenced(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == epochFencedCode {
		return fmt.Errorf("%s: %w", pe.Message, ErrFenced)
	}
	return nil
}
