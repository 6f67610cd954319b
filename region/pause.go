package region

import (
	"context"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// The kill switch: the coordinator pauses a sale (SKU "") or one SKU of it at every region
// (SetPaused), and the region's leader then refuses every new hold of it with PAUSED, while
// Confirm, Release and expiry of existing holds go on. A pause is stored in the region's
// pauses table by the same fenced op that changes it in memory, so a new leader (loadMem)
// and a standby's warm copy (readChanges) have it before they serve.

// PauseVersion orders the changes of one pause (a sale's or a SKU's): the coordinator's
// ledger numbers them, rising. A region records a change only over a lower version, so a late
// retry of an older change never undoes a newer one.
type PauseVersion int64

// PauseRequest pauses (Paused) or resumes new reservations of a sale (SKU "") or of one SKU
// of it, fenced by the coordinator's generation like every participant write.
type PauseRequest struct {
	Generation int64
	Sale       string
	SKU        string
	Paused     bool
	Reason     string
	Version    PauseVersion
}

// PauseRecord is the region's durable record of a pause after a SetPaused: a newer change
// recorded before wins over the request.
type PauseRecord struct {
	Paused  bool
	Version PauseVersion
}

// pauseSet is what is paused at a region, each with its reason: a sale as (sale, ""), a SKU
// as (sale, sku). It is never changed once made (a change makes a new set), so the writer
// can publish it to readers by pointer. The nil set pauses nothing.
type pauseSet struct{ reasons map[poolKey]string }

// with returns the set with k paused for reason, or (paused false) resumed.
func (s *pauseSet) with(k poolKey, paused bool, reason string) *pauseSet {
	n := &pauseSet{reasons: map[poolKey]string{}}
	if s != nil {
		n.reasons = maps.Clone(s.reasons)
	}
	if paused {
		n.reasons[k] = reason
	} else {
		delete(n.reasons, k)
	}
	return n
}

// refuse is the answer to a new hold of req's SKU while its sale or the SKU is paused, nil
// otherwise.
func (s *pauseSet) refuse(req ReserveRequest) error {
	if s == nil {
		return nil
	}
	if why, ok := s.reasons[poolKey{req.Sale, ""}]; ok {
		return fmt.Errorf("sale %s is paused%s: no new holds of it are made: %w", req.Sale, because(why), ErrPaused)
	}
	if why, ok := s.reasons[poolKey{req.Sale, req.SKU}]; ok {
		return fmt.Errorf("sku %s of sale %s is paused%s: no new holds of it are made: %w", req.SKU, req.Sale, because(why), ErrPaused)
	}
	return nil
}

func because(reason string) string {
	if reason == "" {
		return ""
	}
	return " (" + reason + ")"
}

// CheckPause validates a SetPaused before it reaches the writer, naming the bad field.
func CheckPause(req PauseRequest) error {
	if err := checkIDs("sale_id", req.Sale); err != nil {
		return err
	}
	if req.SKU != "" {
		if err := checkIDs("sku", req.SKU); err != nil {
			return err
		}
	}
	if req.Version <= 0 {
		return apierr.Invalid("version", "must be positive, got %d", req.Version)
	}
	if why := transfer.CheckText(req.Reason, transfer.MaxReasonLen); why != "" {
		return apierr.Invalid("reason", "%s", why)
	}
	return nil
}

// SetPaused records whether a sale or SKU admits new holds at this region, durably, and
// answers the region's record. The sale's terms need not be here yet: a pause that comes
// first holds once they do.
func (r *Region) SetPaused(ctx context.Context, req PauseRequest) (PauseRecord, error) {
	if err := CheckPause(req); err != nil {
		return PauseRecord{}, err
	}
	if err := r.checkGeneration(ctx, req.Generation); err != nil {
		return PauseRecord{}, err
	}
	return submitOp[PauseRecord](ctx, r.leadership, &setPausedOp{req: req})
}

type setPausedOp struct{ req PauseRequest }

// apply records the change in the pauses table, fenced by the coordinator's generation (I4),
// unless a change of the same generation and the same or a higher version is there already
// (changes are ordered by generation first, so a newer coordinator leader's change replaces
// whatever an older generation recorded, whatever its version), and then makes memory
// say what the table says: from this batch on, no reserve of a paused sale or SKU takes units
// (I1, I2 and I3 are untouched: no count moves; Confirm, Release and expiry go on as before,
// so I5 and I6 hold for the holds already made). Memory changes only after every statement
// succeeded; a batch that then fails reloads it from the table.
func (o *setPausedOp) apply(ctx context.Context, b *batch) (PauseRecord, error, error) {
	r := o.req
	tx, outcome, fatal := b.fencedOp(ctx, r.Sale, r.Generation)
	if tx == nil {
		return PauseRecord{}, outcome, fatal
	}
	if _, err := tx.Exec(ctx, `INSERT INTO pauses (sale_id, sku, paused, reason, version, generation, changed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (sale_id, sku) DO UPDATE SET paused = excluded.paused, reason = excluded.reason,
			version = excluded.version, generation = excluded.generation, changed_at = excluded.changed_at
		WHERE (pauses.generation, pauses.version) < (excluded.generation, excluded.version)`,
		r.Sale, r.SKU, r.Paused, r.Reason, int64(r.Version), r.Generation, b.now); err != nil {
		return PauseRecord{}, nil, fmt.Errorf("record pause: %w", err)
	}
	var rec PauseRecord
	var reason string
	var version int64
	if err := tx.QueryRow(ctx, `SELECT paused, reason, version FROM pauses WHERE sale_id = $1 AND sku = $2`, r.Sale, r.SKU).
		Scan(&rec.Paused, &reason, &version); err != nil {
		return PauseRecord{}, nil, fmt.Errorf("read pause: %w", err)
	}
	rec.Version = PauseVersion(version)
	b.m.paused = b.m.paused.with(poolKey{r.Sale, r.SKU}, rec.Paused, reason)
	return rec, nil, nil
}

// loadPauses reads every pause in force into m, in tx's snapshot.
func loadPauses(ctx context.Context, tx pgx.Tx, m *memState) error {
	rows, err := tx.Query(ctx, `SELECT sale_id, sku, reason FROM pauses WHERE paused`)
	if err != nil {
		return fmt.Errorf("load pauses: %w", err)
	}
	set := &pauseSet{reasons: map[poolKey]string{}}
	var k poolKey
	var reason string
	if _, err := pgx.ForEachRow(rows, []any{&k.sale, &k.sku, &reason}, func() error {
		set.reasons[k] = reason
		return nil
	}); err != nil {
		return fmt.Errorf("load pauses: %w", err)
	}
	m.paused = set
	return nil
}

// Paused lists what is paused at this region as its leader decides (sale → the paused SKUs,
// "" for the whole sale, each with its reason); empty when not leading.
func (r *Region) Paused() map[string]map[string]string {
	out := map[string]map[string]string{}
	s := r.paused.Load()
	if s == nil {
		return out
	}
	for k, why := range s.reasons {
		if out[k.sale] == nil {
			out[k.sale] = map[string]string{}
		}
		out[k.sale][k.sku] = why
	}
	return out
}
