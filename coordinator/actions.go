package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// The operators' action log: every state-changing call made to this coordinator (the gRPC
// adapter's and the console's) is recorded after it returns, with its caller and result, as
// one row of a hash chain (transfer.ActionHash). Rows are appended one at a time under a
// transaction-scoped advisory lock, so the chain is linear whichever coordinator (leader or
// standby: a refused call is an action too) records. The log is no part of the stock's state,
// so it is not written under the generation fence.

// Bounds of the action log.
const (
	// MaxActionText bounds each text field of a recorded action, in bytes (longer is cut).
	MaxActionText = 4096
	// MaxActionsListed bounds one ListActions.
	MaxActionsListed = 1000
	// actionLock is the advisory lock that serializes appends.
	actionLock = 0x71756f74615f6163 // "quota_ac"
)

// RecordAction appends a to the action log, stamping its time, sequence number and hashes;
// its text fields are cut to MaxActionText and made valid text. It returns the row recorded.
func (c *Coordinator) RecordAction(ctx context.Context, a transfer.Action) (transfer.Action, error) {
	for _, f := range []*string{&a.Role, &a.Actor, &a.Via, &a.Action, &a.Target, &a.Detail, &a.Result} {
		*f = transfer.AsText(*f, MaxActionText)
	}
	a.At = c.cfg.Clock.Now().UTC().Truncate(time.Microsecond) // as the database keeps it
	err := pgutil.Tx(ctx, c.ledger.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(actionLock)); err != nil {
			return err
		}
		a.Seq, a.PrevHash = 1, transfer.GenesisHash
		err := tx.QueryRow(ctx, `SELECT seq + 1, hash FROM actions ORDER BY seq DESC LIMIT 1`).Scan(&a.Seq, &a.PrevHash)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		a.Hash = transfer.ActionHash(a.PrevHash, a)
		_, err = tx.Exec(ctx, `INSERT INTO actions (seq, at, role, actor, via, action, target, detail, result, prev_hash, hash)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			a.Seq, a.At, a.Role, a.Actor, a.Via, a.Action, a.Target, a.Detail, a.Result, a.PrevHash, a.Hash)
		return err
	})
	if err != nil {
		return a, fmt.Errorf("record action %s: %w", a.Action, err)
	}
	return a, nil
}

// ListActions lists the action log's rows after sequence number after, oldest first, at
// most limit (1..MaxActionsListed), with their hashes as stored.
func (r Records) ListActions(ctx context.Context, after int64, limit int) ([]transfer.Action, error) {
	if limit < 1 || limit > MaxActionsListed {
		return nil, apierr.Invalid("limit", "must be 1..%d, got %d", MaxActionsListed, limit)
	}
	if after < 0 {
		return nil, apierr.Invalid("after_seq", "must not be negative, got %d", after)
	}
	rows, err := r.c.ledger.db.Query(ctx, `SELECT seq, at, role, actor, via, action, target, detail, result, prev_hash, hash
		FROM actions WHERE seq > $1 ORDER BY seq LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list actions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (transfer.Action, error) {
		var a transfer.Action
		err := row.Scan(&a.Seq, &a.At, &a.Role, &a.Actor, &a.Via, &a.Action, &a.Target, &a.Detail, &a.Result, &a.PrevHash, &a.Hash)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list actions: %w", err)
	}
	return out, nil
}

// Records are the coordinator's reads for auditors and operators beyond the audit itself:
// the per-user limit from the regions' records (AuditLimits), their late payments
// (LatePayments), the action log (ListActions) and the ledger's part of the cluster's status
// (LedgerStatus).
type Records struct{ c *Coordinator }

// Records are the auditors' reads of this coordinator.
func (c *Coordinator) Records() Records { return Records{c} }
