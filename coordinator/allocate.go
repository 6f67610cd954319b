package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// AllocateRequest splits a sale's unallocated units over regions by weight.
type AllocateRequest struct {
	Sale      string
	Weights   []transfer.Weight
	RequestID string
}

func (s *regionSet) checkAllocate(req AllocateRequest) error {
	if err := checkSaleID(req.Sale); err != nil {
		return err
	}
	if why := transfer.CheckID(req.RequestID); why != "" {
		return apierr.Invalid("request_id", "%s", why)
	}
	if len(req.Weights) == 0 {
		return apierr.Invalid("weights", "name at least one region")
	}
	seen := map[string]bool{}
	var sum int64
	for _, w := range req.Weights {
		if _, ok := s.byName[w.Region]; !ok {
			return apierr.Invalid("weights", "unknown region %q", w.Region)
		}
		if seen[w.Region] {
			return apierr.Invalid("weights", "region %q listed twice", w.Region)
		}
		seen[w.Region] = true
		if w.Weight < 0 || w.Weight > 1_000_000 {
			return apierr.Invalid("weights", "region %s: weight must be 0..1000000, got %d", w.Region, w.Weight)
		}
		sum += w.Weight
	}
	if sum == 0 {
		return apierr.Invalid("weights", "weights sum to zero")
	}
	return nil
}

func transferID(requestID, sku, region string) string {
	h := sha256.Sum256([]byte(requestID + "\x00" + sku + "\x00" + region))
	return "t-" + hex.EncodeToString(h[:12])
}

// Allocate moves each SKU's unallocated units to regions by weight (largest remainder), as
// one transfer per (SKU, region) from the unallocated pool. Steps 1–3 of the protocol are
// one ledger transaction (the source is the ledger itself): the transfer is recorded pending
// and unallocated drops by its units, so I1 holds (unallocated → in flight). Each transfer is
// then credited at its region (step 4) and posted (step 5). Idempotent by RequestID: a retry
// drives the same transfers; the same id with other weights is ErrAlreadyExists. A region
// that does not answer leaves its transfer pending (in flight, retried in the background),
// never reassigned.
func (c *Coordinator) Allocate(ctx context.Context, req AllocateRequest) ([]transfer.Transfer, bool, error) {
	if err := c.regions.checkAllocate(req); err != nil {
		return nil, false, err
	}
	gen, err := c.Generation()
	if err != nil {
		return nil, false, err
	}
	fp, _ := json.Marshal(req.Weights)
	replayed := false
	err = c.ledger.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		replayed = false
		var have string
		err := tx.QueryRow(ctx, `SELECT fingerprint FROM allocations WHERE request_id = $1`, req.RequestID).Scan(&have)
		if err == nil {
			if have != req.Sale+" "+string(fp) {
				return fmt.Errorf("request_id %q was used for another allocation: %w", req.RequestID, ErrAlreadyExists)
			}
			replayed = true
			return nil
		}
		if err != pgx.ErrNoRows {
			return err
		}
		return c.ledger.recordAllocation(ctx, tx, gen, req, string(fp))
	})
	if err != nil {
		return nil, false, err
	}
	ts, err := c.ledger.transfersOf(ctx, req.RequestID)
	if err != nil {
		return nil, replayed, err
	}
	var errs []error
	for i := range ts {
		ts[i], err = c.driver.drive(ctx, gen, ts[i])
		errs = append(errs, err)
	}
	return ts, replayed, errors.Join(errs...)
}

func (l *ledger) recordAllocation(ctx context.Context, tx pgx.Tx, gen int64, req AllocateRequest, fp string) error {
	now := l.clock.Now()
	rows, err := tx.Query(ctx, `SELECT sku, unallocated FROM skus WHERE sale_id = $1 ORDER BY sku FOR UPDATE`, req.Sale)
	if err != nil {
		return err
	}
	type skuRow struct {
		SKU   string
		Units int64
	}
	skus, err := pgx.CollectRows(rows, pgx.RowToStructByPos[skuRow])
	if err != nil {
		return err
	}
	if len(skus) == 0 {
		return apierr.NotFound("sale_id", req.Sale)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO allocations (request_id, sale_id, fingerprint, created_at) VALUES ($1, $2, $3, $4)`,
		req.RequestID, req.Sale, req.Sale+" "+fp, now); err != nil {
		return err
	}
	for _, k := range skus {
		parts, err := transfer.Split(transfer.Units(k.Units), req.Weights)
		if err != nil {
			return apierr.Invalid("weights", "%v", err)
		}
		for i, w := range req.Weights {
			if parts[i] == 0 {
				continue
			}
			if _, err := tx.Exec(ctx, `INSERT INTO transfers (transfer_id, request_id, sale_id, sku, from_pool, to_pool, units, state, generation, created_at, updated_at, settled)
				VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, $9, true)`,
				transferID(req.RequestID, k.SKU, w.Region), "allocate/"+req.RequestID, req.Sale, k.SKU, transfer.Unallocated, w.Region, int64(parts[i]), gen, now); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE skus SET unallocated = unallocated - $3 WHERE sale_id = $1 AND sku = $2`,
				req.Sale, k.SKU, int64(parts[i])); err != nil {
				return err
			}
		}
	}
	return nil
}

const transferColumns = `transfer_id, sale_id, sku, from_pool, to_pool, units, state, generation, stranded, reason, created_at, settled`

func scanTransfer(row pgx.CollectableRow) (transfer.Transfer, error) {
	var t transfer.Transfer
	var units int64
	var state string
	var created time.Time
	err := row.Scan(&t.ID, &t.Sale, &t.SKU, &t.From, &t.To, &units, &state, &t.Generation, &t.Stranded, &t.Reason, &created, &t.Settled)
	t.Units, t.State, t.CreatedAt = transfer.Units(units), transfer.State(state), created
	return t, err
}

func (l *ledger) transfersOf(ctx context.Context, requestID string) ([]transfer.Transfer, error) {
	rows, err := l.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE request_id = $1
		ORDER BY sku, to_pool`, "allocate/"+requestID) // manual transfers' ids live under transfer/
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanTransfer)
}

// Transfers lists the ledger's transfers, of one sale or all.
func (c *Coordinator) Transfers(ctx context.Context, sale string) ([]transfer.Transfer, error) {
	if sale != "" { // "": every sale
		if err := checkSaleID(sale); err != nil {
			return nil, err
		}
	}
	rows, err := c.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE $1 = '' OR sale_id = $1 ORDER BY created_at, transfer_id`, sale)
	if err != nil {
		return nil, err
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil || len(ts) > 0 || sale == "" {
		return ts, err
	}
	// No transfers: say whether the sale has none or does not exist (a mistyped id).
	return ts, saleMustExist(ctx, c.ledger.db, sale)
}
