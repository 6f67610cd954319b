package coordinator

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// The states OpenTransfers counts. Each unfinished transfer is in exactly one of them.
const (
	// TransferRequested: recorded, its source not yet debited.
	TransferRequested = "requested"
	// TransferPending: debited at its source, not yet credited at its destination.
	TransferPending = "pending"
	// TransferStranded: requested or pending, flagged stranded (a step failed and it is older
	// than StrandAfter): its units are in no region's pool until it is resolved.
	TransferStranded = "stranded"
	// TransferUnsettled: posted, its source not yet told that the destination credited it.
	TransferUnsettled = "unsettled"
)

// OpenTransferStates lists the states of OpenTransfers in the order it answers them.
var OpenTransferStates = []string{TransferRequested, TransferPending, TransferStranded, TransferUnsettled}

// TransferCount is how many unfinished transfers one state has, and their units.
type TransferCount struct {
	State string
	Count int64
	Units transfer.Units
}

// OpenTransfers counts the ledger's unfinished transfers by state, one entry per state of
// OpenTransferStates (zero when it has none). Finished transfers (posted and settled,
// voided) are not read: the cost is that of the driver's own round over the same rows.
func (c *Coordinator) OpenTransfers(ctx context.Context) ([]TransferCount, error) {
	rows, err := c.ledger.db.Query(ctx, `SELECT CASE WHEN state = 'posted' THEN 'unsettled' WHEN stranded THEN 'stranded' ELSE state END,
			count(*), coalesce(sum(units), 0)
		FROM transfers WHERE state IN ('requested', 'pending') OR (state = 'posted' AND NOT settled) GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("count open transfers: %w", err)
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TransferCount, error) {
		var tc TransferCount
		var units int64
		err := row.Scan(&tc.State, &tc.Count, &units)
		tc.Units = transfer.Units(units)
		return tc, err
	})
	if err != nil {
		return nil, fmt.Errorf("count open transfers: %w", err)
	}
	out := make([]TransferCount, len(OpenTransferStates))
	for i, s := range OpenTransferStates {
		out[i].State = s
		for _, tc := range counts {
			if tc.State == s {
				out[i] = tc
			}
		}
	}
	return out, nil
}
