package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// TransferRequest moves units of one SKU between two pools: regions, or the unallocated pool.
type TransferRequest struct {
	Sale, SKU, From, To string
	Units               transfer.Units
	// RequestID makes the transfer idempotent: the same id drives the same transfer.
	RequestID string
}

// transferRequestPrefix marks a transfers row's request_id as a Transfer call's (allocations
// store "allocate/<id>").
const transferRequestPrefix = "transfer/"

func (s *regionSet) checkPool(field, name string) error {
	if name == transfer.Unallocated {
		return nil
	}
	if _, ok := s.byName[name]; !ok {
		return apierr.Invalid(field, "unknown region %q", name)
	}
	return nil
}

func (s *regionSet) checkTransfer(req TransferRequest) error {
	for _, f := range [][2]string{{"sale_id", req.Sale}, {"sku", req.SKU}, {"request_id", req.RequestID}} {
		if why := transfer.CheckID(f[1]); why != "" {
			return apierr.Invalid(f[0], "%s", why)
		}
	}
	if err := s.checkPool("from", req.From); err != nil {
		return err
	}
	if err := s.checkPool("to", req.To); err != nil {
		return err
	}
	if req.From == req.To {
		return apierr.Invalid("to", "must differ from from (%s)", req.From)
	}
	if req.Units <= 0 || req.Units > transfer.MaxUnits {
		return apierr.Invalid("units", "must be 1..%d, got %d", transfer.MaxUnits, req.Units)
	}
	return nil
}

// TransferID is the transfer id a request id stands for.
func TransferID(requestID string) string {
	h := sha256.Sum256([]byte("transfer\x00" + requestID))
	return "t-" + hex.EncodeToString(h[:12])
}

// Transfer records a transfer (protocol step 1: requested, fenced) and drives it as far as
// the participants answer now. A transfer that cannot finish is returned in its current
// state (pending: in flight; stranded once its outcome has stayed unknown), not as an error;
// the background driver carries on. A ledger write that fails while stranding or settling
// it is an error (FENCED when a newer coordinator leads), returned with the transfer as the
// ledger has it. Bad input and a source that is visibly short are refused before anything
// is recorded.
func (c *Coordinator) Transfer(ctx context.Context, req TransferRequest) (transfer.Transfer, bool, error) {
	if err := c.regions.checkTransfer(req); err != nil {
		return transfer.Transfer{}, false, err
	}
	gen, err := c.Generation()
	if err != nil {
		return transfer.Transfer{}, false, err
	}
	id := TransferID(req.RequestID)
	regionHas, err := c.regions.sourceAvailable(ctx, c.cfg.CallTimeout, req)
	if err != nil {
		return transfer.Transfer{}, false, err
	}
	replayed := false
	err = c.ledger.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		replayed = false
		rows, err := tx.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE transfer_id = $1`, id)
		if err != nil {
			return err
		}
		have, err := pgx.CollectRows(rows, scanTransfer)
		if err != nil {
			return err
		}
		if len(have) == 1 {
			h := have[0]
			if h.Sale != req.Sale || h.SKU != req.SKU || h.From != req.From || h.To != req.To || h.Units != req.Units {
				// Request ids are one namespace across sales (the transfer id is derived from
				// the request id alone), so name the sale: the other use may be in another.
				return fmt.Errorf("request_id %q was used for another transfer (sale %s: %d %s %s → %s); request ids are unique across sales: %w",
					req.RequestID, h.Sale, h.Units, h.SKU, h.From, h.To, ErrAlreadyExists)
			}
			replayed = true
			return nil
		}
		if err := checkSource(ctx, tx, req, regionHas); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO transfers (transfer_id, request_id, sale_id, sku, from_pool, to_pool, units, state, generation, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 'requested', $8, $9, $9)`,
			id, transferRequestPrefix+req.RequestID, req.Sale, req.SKU, req.From, req.To, int64(req.Units), gen, c.cfg.Clock.Now())
		return err
	})
	if err != nil {
		return transfer.Transfer{}, false, err
	}
	t, err := c.GetTransfer(ctx, id)
	if err != nil {
		return t, replayed, err
	}
	t, err = c.driver.drive(ctx, gen, t)
	return t, replayed, err
}

// sourceAvailable reads a source region's available units of the SKU from its database,
// outside any ledger transaction (a slow region must not hold the ledger fence) and bounded
// in time. It is advice: the source's Debit decides.
func (s *regionSet) sourceAvailable(ctx context.Context, timeout time.Duration, req TransferRequest) (transfer.Units, error) {
	if req.From == transfer.Unallocated {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	books, err := s.byName[req.From].Books(ctx, req.Sale)
	if err != nil {
		return 0, fmt.Errorf("read source %s: %w", req.From, err)
	}
	for _, p := range books.Pools {
		if p.SKU == req.SKU {
			return p.Available, nil
		}
	}
	return 0, nil
}

// checkSource refuses a transfer whose SKU is unknown or whose source visibly has fewer
// units than asked (the source's Debit stays the authority: it may still refuse).
func checkSource(ctx context.Context, tx pgx.Tx, req TransferRequest, regionHas transfer.Units) error {
	var unalloc int64
	err := tx.QueryRow(ctx, `SELECT unallocated FROM skus WHERE sale_id = $1 AND sku = $2`, req.Sale, req.SKU).Scan(&unalloc)
	if err == pgx.ErrNoRows {
		if err := saleMustExist(ctx, tx, req.Sale); err != nil {
			return err
		}
		return fmt.Errorf("sale %q has no sku %q: %w", req.Sale, req.SKU, ErrNotFound)
	}
	if err != nil {
		return err
	}
	have := transfer.Units(unalloc)
	if req.From != transfer.Unallocated {
		have = regionHas
	}
	if have < req.Units {
		return apierr.Invalid("units", "%s has %d %s available, fewer than %d", req.From, have, req.SKU, req.Units)
	}
	return nil
}

// GetTransfer reads one transfer from the ledger.
func (c *Coordinator) GetTransfer(ctx context.Context, id string) (transfer.Transfer, error) {
	if why := transfer.CheckID(id); why != "" {
		return transfer.Transfer{}, apierr.Invalid("transfer_id", "%s", why)
	}
	rows, err := c.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE transfer_id = $1`, id)
	if err != nil {
		return transfer.Transfer{}, err
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil {
		return transfer.Transfer{}, err
	}
	if len(ts) == 0 {
		return transfer.Transfer{}, apierr.NotFound("transfer_id", id)
	}
	return ts[0], nil
}

// Resolve settles an unfinished transfer by its participants' durable records, never by a
// timeout: it drives the transfer again (credit at the destination, which the destination
// decides), or, with refuse, first asks the destination to refuse it (a tombstone unless it
// already credited) and then restores the source. A requested transfer refused is first
// refused at its source (the debit's cancellation; see NewDrive). Resolving a finished
// transfer returns it.
func (c *Coordinator) Resolve(ctx context.Context, id string, refuse bool) (transfer.Transfer, error) {
	t, err := c.GetTransfer(ctx, id)
	if err != nil || (t.State.Final() && (t.State != transfer.Posted || t.Settled)) {
		return t, err
	}
	gen, err := c.Generation()
	if err != nil {
		return t, err
	}
	return c.driver.run(ctx, NewDrive(c.driver.config(), gen, t, refuse))
}
