package coordinator

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/pgutil"
)

// ledger is the coordinator's database and its generation fence (I4): every part that
// writes the ledger does it through fencedTx, and the parts that only read it use db. Its
// SQL for the transfer driver is in ledgersql.go; its reads of sales, pauses and transfers
// are with the part that owns them.
type ledger struct {
	db    *pgxpool.Pool
	clock clock.Clock
	// rejected counts the ledger writes the generation fence refused (I4).
	rejected atomic.Int64
}

// fencedTx runs fn in a ledger transaction that first passes the generation fence (I4).
func (l *ledger) fencedTx(ctx context.Context, gen int64, fn func(pgx.Tx) error) error {
	return pgutil.Tx(ctx, l.db, func(tx pgx.Tx) error {
		if err := l.checkFence(ctx, tx, gen); err != nil {
			return err
		}
		return fn(tx)
	})
}

// checkFence passes the ledger's generation fence in tx, counting a refusal.
func (l *ledger) checkFence(ctx context.Context, tx pgx.Tx, gen int64) error {
	err := fencing.CheckLedgerGeneration(ctx, tx, gen)
	if errors.Is(err, ErrFenced) {
		l.rejected.Add(1)
	}
	return err
}
