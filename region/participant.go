package region

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// PutSale records a sale's terms, fenced by the coordinator's generation.
func (r *Region) PutSale(ctx context.Context, gen int64, t SaleTerms) error {
	if err := CheckTerms(t); err != nil {
		return err
	}
	if err := r.checkGeneration(ctx, gen); err != nil {
		return err
	}
	// Keep the terms at the precision they are stored with (opens_at in microseconds, the
	// TTL in milliseconds), so a retry compares equal to the stored terms and the cached
	// terms are the ones a reload reads back.
	t.OpensAt, t.HoldTTL = t.OpensAt.Truncate(time.Microsecond), t.HoldTTL.Truncate(time.Millisecond)
	t.Admission.TicketTTL = t.Admission.TicketTTL.Truncate(time.Millisecond)
	_, err := submitOp[struct{}](ctx, r.leadership, &putSaleOp{gen: gen, terms: t})
	return err
}

// CheckTerms validates a sale's terms, naming the bad field.
func CheckTerms(t SaleTerms) error {
	if err := checkIDs("sale_id", t.Sale); err != nil {
		return err
	}
	if len(t.SKUs) == 0 {
		return apierr.Invalid("skus", "a sale needs at least one SKU")
	}
	for _, s := range t.SKUs {
		if err := checkIDs("sku", s); err != nil {
			return err
		}
	}
	if t.PerUserLimit <= 0 || t.PerUserLimit > transfer.MaxUnits {
		return apierr.Invalid("per_user_limit", "must be 1..%d, got %d", transfer.MaxUnits, t.PerUserLimit)
	}
	if t.HoldTTL < time.Second || t.HoldTTL > 24*time.Hour {
		return apierr.Invalid("hold_ttl", "must be 1s..24h, got %s", t.HoldTTL)
	}
	if field, why := t.Admission.Check(); field != "" {
		return apierr.Invalid(field, "%s", why)
	}
	return nil
}

// checkGeneration bounds a coordinator request's generation by the coordinator leader's
// generation as etcd reports it, read again only when gen is above the highest read so far.
// A generation from the future would raise the sale's fence past every real leader and lock
// the coordinator out of the sale for good (I4 keeps fences from falling), so it is refused
// before it reaches the writer and raises nothing. A deposed coordinator's lower generation
// passes here and meets the SQL fence.
func (r *Region) checkGeneration(ctx context.Context, gen int64) error {
	if gen < 1 {
		return fmt.Errorf("generation %d: not a coordinator's generation: %w", gen, ErrFenced)
	}
	if r.cfg.Cluster.CoordinatorGeneration == nil || gen <= r.coordGen.Load() {
		return nil
	}
	cur, err := r.cfg.Cluster.CoordinatorGeneration(ctx)
	if err != nil {
		return fmt.Errorf("reading the coordinator leader's generation: %v: %w", err, apierr.ErrAborted)
	}
	for old := r.coordGen.Load(); cur > old && !r.coordGen.CompareAndSwap(old, cur); old = r.coordGen.Load() {
	}
	if gen > cur {
		return apierr.Invalid("generation", "above the coordinator leader's generation in etcd; no fence was raised")
	}
	return nil
}

type putSaleOp struct {
	gen   int64
	terms SaleTerms
}

// apply records the sale's terms, fenced by the coordinator's generation (I4). Terms never
// change once recorded: a different definition under the same id is refused.
func (o *putSaleOp) apply(ctx context.Context, b *batch) (struct{}, error, error) {
	t := o.terms
	tx, outcome, fatal := b.fencedOp(ctx, t.Sale, o.gen)
	if tx == nil {
		return struct{}{}, outcome, fatal
	}
	have, err := readTerms(ctx, tx, t.Sale)
	if err == nil {
		if !sameTerms(have, t) {
			return struct{}{}, fmt.Errorf("sale_id %q is already defined with other terms: %w", t.Sale, ErrAlreadyExists), nil
		}
		return struct{}{}, nil, nil
	}
	if !isNotFound(err) {
		return struct{}{}, nil, err
	}
	a := t.Admission
	if _, err := tx.Exec(ctx, `INSERT INTO sales (sale_id, skus, per_user_limit, hold_ttl_ms, opens_at, admit_rate, ticket_ttl_ms,
		max_live_tickets, room_return_url) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, t.Sale, t.SKUs, int64(t.PerUserLimit),
		t.HoldTTL.Milliseconds(), t.OpensAt, a.Rate, a.TicketTTL.Milliseconds(), a.MaxLive, a.ReturnURL); err != nil {
		return struct{}{}, nil, fmt.Errorf("insert sale: %w", err)
	}
	b.sales[t.Sale] = t
	return struct{}{}, nil, nil
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

func sameTerms(a, b SaleTerms) bool {
	return a.Sale == b.Sale && slices.Equal(a.SKUs, b.SKUs) && a.PerUserLimit == b.PerUserLimit &&
		a.HoldTTL == b.HoldTTL && a.OpensAt.Equal(b.OpensAt) && a.Admission == b.Admission
}

// Credit adds a transfer's units to this region, once per transfer id, and returns the
// region's durable record of it (credited, or refused when a refusal came first).
func (r *Region) Credit(ctx context.Context, req CreditRequest) (transfer.InState, error) {
	if err := CheckCredit(req); err != nil {
		return "", err
	}
	if err := r.checkGeneration(ctx, req.Generation); err != nil {
		return "", err
	}
	res, err := submitOp[creditResult](ctx, r.leadership, &creditOp{req: req})
	return res.state, err
}

// CheckCredit validates a Credit or a Refuse before it reaches the writer, naming the bad
// field: the ids, and units 0..MaxUnits (a credit of 0 creates the pool row, empty; the
// coordinator sends none, but nothing is wrong with one).
func CheckCredit(req CreditRequest) error {
	if err := checkIDs("transfer_id", req.TransferID, "sale_id", req.Sale, "sku", req.SKU); err != nil {
		return err
	}
	if req.Units < 0 || req.Units > transfer.MaxUnits {
		return apierr.Invalid("units", "must be 0..%d, got %d", transfer.MaxUnits, req.Units)
	}
	return nil
}

type creditOp struct {
	req CreditRequest
}

// creditResult is the destination's durable record of the transfer after the op.
type creditResult struct{ state transfer.InState }

// apply is protocol step 4 at the destination: it adds a transfer's units to the pool once
// per transfer id, fenced by the coordinator's generation (I4). A retry of the same credit
// answers "credited" again without adding anything; a credit after a refusal answers
// "refused" (I5: never both). Preserves I3: credited_in and available rise together.
func (o *creditOp) apply(ctx context.Context, b *batch) (creditResult, error, error) {
	r := o.req
	tx, outcome, fatal := b.fencedOp(ctx, r.Sale, r.Generation)
	if tx == nil {
		return creditResult{}, outcome, fatal
	}
	terms, err := readTerms(ctx, tx, r.Sale)
	if err != nil {
		if isNotFound(err) {
			return creditResult{}, err, nil
		}
		return creditResult{}, nil, err
	}
	if !terms.HasSKU(r.SKU) {
		return creditResult{}, fmt.Errorf("sku %q is not in sale %s: %w", r.SKU, r.Sale, ErrNotFound), nil
	}
	have, err := readIn(ctx, tx, r.TransferID)
	if err != nil {
		return creditResult{}, nil, err
	}
	st, eff, err := creditEffects(have, r)
	if err != nil {
		return creditResult{}, transferErr(r.TransferID, err), nil
	}
	if eff.poolRow {
		var avail int64
		err = tx.QueryRow(ctx, `INSERT INTO pools (sale_id, sku, available, held, sold, credited_in, debited_out)
			VALUES ($1, $2, $3, 0, 0, $4, 0)
			ON CONFLICT (sale_id, sku) DO UPDATE SET available = pools.available + excluded.available,
				credited_in = pools.credited_in + excluded.credited_in
			RETURNING available`, r.Sale, r.SKU, int64(eff.pool.available), int64(eff.pool.creditedIn)).Scan(&avail)
		if err != nil {
			return creditResult{}, nil, fmt.Errorf("credit pool: %w", err)
		}
		b.setAvailable(poolKey{r.Sale, r.SKU}, transfer.Units(avail))
	}
	if err := insertIn(ctx, tx, b, eff.in, r.Generation); err != nil {
		return creditResult{}, nil, fmt.Errorf("record credit: %w", err)
	}
	return creditResult{state: st}, nil, nil
}

// insertIn writes a destination's new record of a transfer (nil: none).
func insertIn(ctx context.Context, tx pgx.Tx, b *batch, rec *transfer.InboundRecord, gen int64) error {
	if rec == nil {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO transfers_in (transfer_id, sale_id, sku, units, state, generation, recorded_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, rec.ID, rec.Sale, rec.SKU, int64(rec.Units), string(rec.State), gen, b.now)
	return err
}

// readIn reads a destination's record of a transfer (nil: none).
func readIn(ctx context.Context, tx pgx.Tx, id string) (*transfer.InboundRecord, error) {
	r := transfer.InboundRecord{ID: id}
	var u int64
	var st string
	err := tx.QueryRow(ctx, `SELECT sale_id, sku, units, state FROM transfers_in WHERE transfer_id = $1`, id).
		Scan(&r.Sale, &r.SKU, &u, &st)
	if err == pgx.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read transfer record: %w", err)
	}
	r.Units, r.State = transfer.Units(u), transfer.InState(st)
	return &r, nil
}

// transferErr turns a participant decision's refusal into the region's API error.
func transferErr(id string, err error) error {
	switch {
	case errors.Is(err, transfer.ErrOtherContent):
		return fmt.Errorf("transfer_id %q was recorded with other content: %w", id, ErrAlreadyExists)
	case errors.Is(err, transfer.ErrNotDebited):
		return fmt.Errorf("transfer_id %q was never debited here: %w", id, ErrNotFound)
	case errors.Is(err, transfer.ErrWrongState):
		return fmt.Errorf("transfer_id %q is %v: %w", id, err, ErrConflict)
	}
	return err
}

// Refuse is the abort step at a destination: it answers refused (a tombstone now stops any
// credit) or credited (too late to refuse).
func (r *Region) Refuse(ctx context.Context, req CreditRequest) (transfer.InState, error) {
	if err := CheckCredit(req); err != nil {
		return "", err
	}
	if err := r.checkGeneration(ctx, req.Generation); err != nil {
		return "", err
	}
	return submitOp[transfer.InState](ctx, r.leadership, &refuseOp{req: req})
}

type refuseOp struct{ req CreditRequest }

// apply is the abort step at the destination: unless the transfer was already credited, it
// writes a refused tombstone so any later Credit of it answers refused (I5: never both
// credited and restored). It reports the destination's durable record either way.
func (o *refuseOp) apply(ctx context.Context, b *batch) (transfer.InState, error, error) {
	r := o.req
	tx, outcome, fatal := b.fencedOp(ctx, r.Sale, r.Generation)
	if tx == nil {
		return "", outcome, fatal
	}
	have, err := readIn(ctx, tx, r.TransferID)
	if err != nil {
		return "", nil, err
	}
	st, eff := refuseEffects(have, r)
	if err := insertIn(ctx, tx, b, eff.in, r.Generation); err != nil {
		return "", nil, fmt.Errorf("record refusal: %w", err)
	}
	return st, nil, nil
}

// DebitRequest takes a transfer's units out of this region's pool (the source).
type DebitRequest struct {
	Generation int64
	TransferID string
	Sale       string
	SKU        string
	To         string
	Units      transfer.Units
}

// Debit is step 2 of a transfer at its source. It answers pending (debited now or before)
// or refused (not enough available; recorded so it stays refused).
func (r *Region) Debit(ctx context.Context, req DebitRequest) (transfer.OutState, error) {
	if err := CheckDebit(req); err != nil {
		return "", err
	}
	if err := r.checkGeneration(ctx, req.Generation); err != nil {
		return "", err
	}
	return submitOp[transfer.OutState](ctx, r.leadership, &debitOp{req: req})
}

// RefuseDebit cancels a requested transfer at its source: unless the source already debited
// it, a refused tombstone is recorded and any later Debit of it answers refused. It answers
// the source's record: refused (nothing was or will be debited), or the state of the debit
// that came first (pending, settled or voided).
func (r *Region) RefuseDebit(ctx context.Context, req DebitRequest) (transfer.OutState, error) {
	if err := CheckDebit(req); err != nil {
		return "", err
	}
	if err := r.checkGeneration(ctx, req.Generation); err != nil {
		return "", err
	}
	return submitOp[transfer.OutState](ctx, r.leadership, &debitOp{req: req, refuse: true})
}

// CheckDebit validates a Debit or a RefuseDebit before it reaches the writer, naming the bad
// field: the ids and units 1..MaxUnits.
func CheckDebit(req DebitRequest) error {
	if err := checkTransferFields(req.TransferID, req.Sale); err != nil {
		return err
	}
	if err := checkIDs("sku", req.SKU, "to", req.To); err != nil {
		return err
	}
	return checkQuantity("units", req.Units)
}

func checkTransferFields(id, sale string) error {
	return checkIDs("transfer_id", id, "sale_id", sale)
}

// debitOp is a Debit, or with refuse a RefuseDebit: the same decision taken as if the pool
// were empty, so it records the refused tombstone unless the transfer was already debited.
type debitOp struct {
	req    DebitRequest
	refuse bool
}

// apply is protocol step 2 at the source: once per transfer id, available −= units and
// debited_out += units (I3 holds; I1: the units move from this pool to in flight), recorded
// as pending. When available is short, or the coordinator is cancelling the transfer
// (refuse), it records a refused tombstone instead, so a late retry cannot debit a transfer
// the coordinator has given up (I5). Fenced (I4).
func (o *debitOp) apply(ctx context.Context, b *batch) (transfer.OutState, error, error) {
	r := o.req
	tx, outcome, fatal := b.fencedOp(ctx, r.Sale, r.Generation)
	if tx == nil {
		return "", outcome, fatal
	}
	have, err := readOut(ctx, tx, r.TransferID)
	if err != nil {
		return "", nil, err
	}
	pk := poolKey{r.Sale, r.SKU}
	var avail int64 // the stored count, locked: the batch's earlier decisions are flushed
	if !o.refuse {
		err = tx.QueryRow(ctx, `SELECT available FROM pools WHERE sale_id = $1 AND sku = $2 FOR UPDATE`, r.Sale, r.SKU).Scan(&avail)
		if err != nil && err != pgx.ErrNoRows {
			return "", nil, fmt.Errorf("read pool: %w", err)
		}
	}
	state, eff, err := debitEffects(have, r, transfer.Units(avail))
	if err != nil {
		return "", transferErr(r.TransferID, err), nil
	}
	if eff.poolRow {
		var left int64
		err = tx.QueryRow(ctx, `UPDATE pools SET available = available + $3, debited_out = debited_out + $4
			WHERE sale_id = $1 AND sku = $2 AND available + $3 >= 0 RETURNING available`,
			r.Sale, r.SKU, int64(eff.pool.available), int64(eff.pool.debitedOut)).Scan(&left)
		if err != nil {
			return "", nil, fmt.Errorf("debit pool (guard: %d were available): %w", avail, err)
		}
		b.setAvailable(pk, transfer.Units(left))
	}
	if rec := eff.out; rec != nil && eff.newOut {
		if _, err := tx.Exec(ctx, `INSERT INTO transfers_out (transfer_id, sale_id, sku, to_pool, units, state, generation, recorded_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)`, rec.ID, rec.Sale, rec.SKU, rec.To, int64(rec.Units), string(rec.State), r.Generation, b.now); err != nil {
			return "", nil, fmt.Errorf("record debit: %w", err)
		}
	}
	return state, nil, nil
}

// readOut reads a source's record of a transfer (nil: none).
func readOut(ctx context.Context, tx pgx.Tx, id string) (*transfer.OutboundRecord, error) {
	r := transfer.OutboundRecord{ID: id}
	var u int64
	var st string
	err := tx.QueryRow(ctx, `SELECT sale_id, sku, to_pool, units, state FROM transfers_out WHERE transfer_id = $1`, id).
		Scan(&r.Sale, &r.SKU, &r.To, &u, &st)
	if err == pgx.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read transfer record: %w", err)
	}
	r.Units, r.State = transfer.Units(u), transfer.OutState(st)
	return &r, nil
}

// TransferRef names a transfer for the steps that need only its id: Restore and Settle.
type TransferRef struct {
	Generation int64
	TransferID string
	Sale       string
}

// Restore returns a refused transfer's units to this source.
func (r *Region) Restore(ctx context.Context, ref TransferRef) (transfer.OutState, error) {
	if err := CheckTransferRef(ref); err != nil {
		return "", err
	}
	if err := r.checkGeneration(ctx, ref.Generation); err != nil {
		return "", err
	}
	return submitOp[transfer.OutState](ctx, r.leadership, &restoreOp{ref: ref})
}

// Settle records at the source that the destination credited the transfer.
func (r *Region) Settle(ctx context.Context, ref TransferRef) (transfer.OutState, error) {
	if err := CheckTransferRef(ref); err != nil {
		return "", err
	}
	if err := r.checkGeneration(ctx, ref.Generation); err != nil {
		return "", err
	}
	return submitOp[transfer.OutState](ctx, r.leadership, &settleOp{ref: ref})
}

// CheckTransferRef validates a Restore or a Settle before it reaches the writer: its ids.
func CheckTransferRef(ref TransferRef) error {
	return checkTransferFields(ref.TransferID, ref.Sale)
}

type restoreOp struct{ ref TransferRef }

// apply returns a pending transfer's units to this source pool: pending → voided,
// available += units and credited_in += units (I3; I1: in flight → available). The
// coordinator calls it only after the destination's durable refusal. Idempotent; a settled
// transfer cannot be restored (I5).
func (o *restoreOp) apply(ctx context.Context, b *batch) (transfer.OutState, error, error) {
	tx, outcome, fatal := b.fencedOp(ctx, o.ref.Sale, o.ref.Generation)
	if tx == nil {
		return "", outcome, fatal
	}
	return transitionOut(ctx, tx, b, o.ref, transfer.OutVoided)
}

type settleOp struct{ ref TransferRef }

// apply marks a credited transfer settled at its source: bookkeeping only, no count moves.
func (o *settleOp) apply(ctx context.Context, b *batch) (transfer.OutState, error, error) {
	tx, outcome, fatal := b.fencedOp(ctx, o.ref.Sale, o.ref.Generation)
	if tx == nil {
		return "", outcome, fatal
	}
	return transitionOut(ctx, tx, b, o.ref, transfer.OutSettled)
}

func transitionOut(ctx context.Context, tx pgx.Tx, b *batch, ref TransferRef, to transfer.OutState) (transfer.OutState, error, error) {
	rec, err := readOut(ctx, tx, ref.TransferID)
	if err != nil {
		return "", nil, err
	}
	if rec != nil && rec.Sale != ref.Sale {
		return "", apierr.Invalid("sale_id", "transfer %s belongs to sale %s", ref.TransferID, rec.Sale), nil
	}
	st, eff, err := outEffects(rec, to)
	if err != nil {
		return "", transferErr(ref.TransferID, err), nil
	}
	if eff.poolRow {
		var avail int64
		if err := tx.QueryRow(ctx, `UPDATE pools SET available = available + $3, credited_in = credited_in + $4
			WHERE sale_id = $1 AND sku = $2 RETURNING available`, rec.Sale, rec.SKU,
			int64(eff.pool.available), int64(eff.pool.creditedIn)).Scan(&avail); err != nil {
			return "", nil, fmt.Errorf("restore pool: %w", err)
		}
		b.setAvailable(poolKey{rec.Sale, rec.SKU}, transfer.Units(avail))
	}
	if eff.out == nil {
		return st, nil, nil
	}
	tag, err := tx.Exec(ctx, `UPDATE transfers_out SET state = $2, updated_at = $3 WHERE transfer_id = $1 AND state = 'pending'`,
		ref.TransferID, string(eff.out.State), b.now)
	if err != nil || tag.RowsAffected() != 1 {
		return "", nil, fmt.Errorf("transfer %s → %s: guard (err %v)", ref.TransferID, to, err)
	}
	return st, nil, nil
}

// TransferStatus is this region's durable knowledge of one transfer, as source and as
// destination ("" where it has no record).
type TransferStatus struct {
	In  transfer.InState
	Out transfer.OutState
}

// Status reads this region's durable records of a transfer (no fence: it changes nothing).
func (r *Region) Status(ctx context.Context, id string) (TransferStatus, error) {
	if err := checkIDs("transfer_id", id); err != nil {
		return TransferStatus{}, err
	}
	var s TransferStatus
	var in, out *string
	err := r.pool.QueryRow(ctx, `SELECT (SELECT state FROM transfers_in WHERE transfer_id = $1),
		(SELECT state FROM transfers_out WHERE transfer_id = $1)`, id).Scan(&in, &out)
	if err != nil {
		return s, fmt.Errorf("read transfer records: %w", err)
	}
	if in != nil {
		s.In = transfer.InState(*in)
	}
	if out != nil {
		s.Out = transfer.OutState(*out)
	}
	return s, nil
}
