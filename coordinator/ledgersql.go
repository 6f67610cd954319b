package coordinator

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// sqlLedger is a Drive's ledger in production: the coordinator's SQL database.
type sqlLedger struct{ ledger *ledger }

// Tx runs fn in one SQL transaction (retried on a serialization failure).
func (l sqlLedger) Tx(ctx context.Context, fn func(LedgerTx) error) error {
	return pgutil.Tx(ctx, l.ledger.db, func(tx pgx.Tx) error { return fn(sqlLedgerTx{ctx, l.ledger, tx}) })
}

// Transfer reads a transfer's current ledger row (another driver finished the step first).
func (l sqlLedger) Transfer(ctx context.Context, id string) (transfer.Transfer, error) {
	rows, err := l.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE transfer_id = $1`, id)
	if err != nil {
		return transfer.Transfer{}, err
	}
	return pgx.CollectExactlyOneRow(rows, scanTransfer)
}

// sqlLedgerTx is the statements of one ledger transaction in SQL.
type sqlLedgerTx struct {
	ctx    context.Context
	ledger *ledger
	tx     pgx.Tx
}

// CheckFence passes the ledger's generation fence (I4), counting a refusal.
func (x sqlLedgerTx) CheckFence(gen int64) error { return x.ledger.checkFence(x.ctx, x.tx, gen) }

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
