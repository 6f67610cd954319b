package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// The continuous audit's memory: every round the leader runs is stored in the ledger
// (audit_rounds, audit_round_sales) with its time, the result of every SKU and the evidence
// of each violation, and kept for Config.AuditRetention. Rows are only added and pruned,
// never changed, so a breach stays in the round that saw it after the books are repaired.

// DefaultAuditRetention is how long quotad's coordinator keeps the continuous audit's rounds
// unless told otherwise (--audit-retention).
const DefaultAuditRetention = 30 * 24 * time.Hour

// Bounds of the history's reads and of its pruning.
const (
	// MaxAuditRounds is the most rounds one AuditHistory answers.
	MaxAuditRounds = 200
	// maxHistorySales bounds the sale rows of one answer: a page stops at the round that
	// reaches it (at least one round is always answered), the caller asks on from there.
	maxHistorySales = 5000
	// pruneBatch rounds are deleted per statement, at most pruneBatches statements a round:
	// what is left goes at the next round.
	pruneBatch, pruneBatches = 1000, 4
)

// AuditRound is one stored round of the continuous audit.
type AuditRound struct {
	ID   int64
	At   time.Time
	Took time.Duration
	OK   bool
	// SKUs is how many SKUs the round audited; Error why it could not audit (then no SKU).
	SKUs  int
	Error string
	// Violations are the round's violations with their evidence (with a sale asked for,
	// that sale's and those of no sale).
	Violations []Violation
	// Sales are the round's results, sale by sale (with a sale asked for, that sale's).
	Sales []AuditRoundSale
}

// AuditRoundSale is one sale's result in a round: each SKU's I1 terms, with each region's
// pool when the SKU was not ok.
type AuditRoundSale struct {
	Sale string
	OK   bool
	SKUs []SKUAudit
}

// AuditHistoryQuery selects stored rounds, newest first.
type AuditHistoryQuery struct {
	// Sale, when set, keeps the rounds that audited it (and those that could not run).
	Sale string
	// Since, when set, keeps the rounds at or after it.
	Since time.Time
	// Before, when positive, keeps the rounds older than that round id: the next page.
	Before int64
	// Limit is the most rounds answered, 1..MaxAuditRounds (0: MaxAuditRounds).
	Limit int
	// RoundsOnly leaves the sales' results out (the console's list of the last rounds).
	RoundsOnly bool
}

// roundSKU is a SKU's result as stored in audit_round_sales.skus.
type roundSKU struct {
	SKU         string      `json:"sku"`
	OK          bool        `json:"ok"`
	Total       int64       `json:"total"`
	Unallocated int64       `json:"unallocated"`
	Available   int64       `json:"available"`
	Held        int64       `json:"held"`
	Sold        int64       `json:"sold"`
	InFlight    int64       `json:"in_flight"`
	Stranded    int64       `json:"stranded"`
	Regions     []roundPool `json:"regions,omitempty"`
}

// roundPool is a region's pool of a SKU that was not ok.
type roundPool struct {
	Region     string `json:"region"`
	Available  int64  `json:"available"`
	Held       int64  `json:"held"`
	Sold       int64  `json:"sold"`
	CreditedIn int64  `json:"credited_in"`
	DebitedOut int64  `json:"debited_out"`
	Reachable  bool   `json:"reachable"`
	Error      string `json:"error,omitempty"`
}

// roundViolation is a violation as stored in audit_rounds.violations.
type roundViolation struct {
	Invariant string `json:"invariant"`
	Sale      string `json:"sale"`
	SKU       string `json:"sku"`
	Region    string `json:"region,omitempty"`
	Detail    string `json:"detail"`
}

func toRoundSKU(a SKUAudit) roundSKU {
	k := roundSKU{SKU: a.SKU, OK: a.OK, Total: int64(a.Total), Unallocated: int64(a.Unallocated), Available: int64(a.Available),
		Held: int64(a.Held), Sold: int64(a.Sold), InFlight: int64(a.InFlight), Stranded: int64(a.Stranded)}
	if !a.OK { // the evidence: where the units are
		for _, r := range a.Regions {
			k.Regions = append(k.Regions, roundPool{Region: r.Region, Available: int64(r.Available), Held: int64(r.Held), Sold: int64(r.Sold),
				CreditedIn: int64(r.CreditedIn), DebitedOut: int64(r.DebitedOut), Reachable: r.Reachable, Error: r.Error})
		}
	}
	return k
}

func (k roundSKU) audit(sale string) SKUAudit {
	a := SKUAudit{Sale: sale, SKU: k.SKU, OK: k.OK, Total: transfer.Units(k.Total), Unallocated: transfer.Units(k.Unallocated),
		Available: transfer.Units(k.Available), Held: transfer.Units(k.Held), Sold: transfer.Units(k.Sold),
		InFlight: transfer.Units(k.InFlight), Stranded: transfer.Units(k.Stranded)}
	for _, r := range k.Regions {
		a.Regions = append(a.Regions, RegionAudit{Region: r.Region, Available: transfer.Units(r.Available), Held: transfer.Units(r.Held),
			Sold: transfer.Units(r.Sold), CreditedIn: transfer.Units(r.CreditedIn), DebitedOut: transfer.Units(r.DebitedOut),
			Reachable: r.Reachable, Error: r.Error})
	}
	return a
}

// roundRows is a report as the rows of audit_round_sales: sale ids, oks, and each sale's
// SKUs as JSON, in the report's order.
func roundRows(rep Report) (sales []string, oks []bool, skus []string, err error) {
	bySale := map[string][]roundSKU{}
	for _, a := range rep.SKUs {
		if _, seen := bySale[a.Sale]; !seen {
			sales = append(sales, a.Sale)
		}
		bySale[a.Sale] = append(bySale[a.Sale], toRoundSKU(a))
	}
	for _, s := range sales {
		ok := true
		for _, k := range bySale[s] {
			ok = ok && k.OK
		}
		b, err := json.Marshal(bySale[s])
		if err != nil {
			return nil, nil, nil, err
		}
		oks, skus = append(oks, ok), append(skus, string(b))
	}
	return sales, oks, skus, nil
}

// record stores one round of the continuous audit under generation gen: rep, or the error
// that kept it from running; took is how long it ran.
func (au *auditor) record(ctx context.Context, gen int64, rep Report, runErr error, took time.Duration) error {
	vs := make([]roundViolation, 0, len(rep.Violations))
	for _, v := range rep.Violations {
		vs = append(vs, roundViolation{v.Invariant, v.Sale, v.SKU, v.Region, v.Detail})
	}
	vj, err := json.Marshal(vs)
	if err != nil {
		return err
	}
	sales, oks, skus, err := roundRows(rep)
	if err != nil {
		return err
	}
	at, errText := rep.At, ""
	if runErr != nil {
		at, errText = au.cfg.Clock.Now(), transfer.AsText(runErr.Error(), transfer.MaxReasonLen)
	}
	return au.ledger.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO audit_rounds (at, took_ms, ok, skus, error, violations)
			VALUES ($1, $2, $3, $4, $5, $6::jsonb) RETURNING round_id`,
			at, took.Milliseconds(), runErr == nil && rep.OK, len(rep.SKUs), errText, string(vj)).Scan(&id)
		if err != nil || len(sales) == 0 {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO audit_round_sales (round_id, sale_id, ok, skus)
			SELECT $1, s, o, k::jsonb FROM unnest($2::text[], $3::bool[], $4::text[]) AS v(s, o, k)`, id, sales, oks, skus)
		return err
	})
}

// prune deletes the rounds older than the retention, in at most pruneBatches batches.
func (au *auditor) prune(ctx context.Context, gen int64) error {
	cutoff := au.cfg.Clock.Now().Add(-au.cfg.AuditRetention)
	for range pruneBatches {
		var n int64
		err := au.ledger.fencedTx(ctx, gen, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `DELETE FROM audit_rounds WHERE round_id IN (
				SELECT round_id FROM audit_rounds WHERE at < $1 ORDER BY round_id LIMIT $2)`, cutoff, pruneBatch)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return fmt.Errorf("prune audit rounds: %w", err)
		}
		if n < pruneBatch {
			return nil
		}
	}
	return nil
}

// AuditHistory lists the continuous audit's stored rounds, newest first, as q selects them.
// A page holds at most q.Limit rounds and about maxHistorySales sale results; next, when
// positive, is the Before of the next page (older rounds may follow).
func (c *Coordinator) AuditHistory(ctx context.Context, q AuditHistoryQuery) (rounds []AuditRound, next int64, err error) {
	if q.Sale != "" {
		if err := checkSaleID(q.Sale); err != nil {
			return nil, 0, err
		}
	}
	if q.Limit < 0 || q.Limit > MaxAuditRounds {
		return nil, 0, apierr.Invalid("limit", "must be 1..%d (0: %d), got %d", MaxAuditRounds, MaxAuditRounds, q.Limit)
	}
	if q.Limit == 0 {
		q.Limit = MaxAuditRounds
	}
	if q.Before < 0 {
		return nil, 0, apierr.Invalid("before", "must not be negative, got %d", q.Before)
	}
	if rounds, err = c.ledger.auditRounds(ctx, q); err != nil {
		return nil, 0, fmt.Errorf("audit history: %w", err)
	}
	if !q.RoundsOnly {
		if err := c.ledger.roundSales(ctx, q.Sale, rounds); err != nil {
			return nil, 0, fmt.Errorf("audit history: %w", err)
		}
	}
	full := len(rounds) == q.Limit
	n := 0
	for i, r := range rounds { // a page stops at the round that reaches the bound
		if n += len(r.Sales); n >= maxHistorySales && i < len(rounds)-1 {
			rounds, full = rounds[:i+1], true
			break
		}
	}
	if full {
		next = rounds[len(rounds)-1].ID
	}
	return rounds, next, nil
}

// auditRounds reads the rounds q selects, without their sales.
func (l *ledger) auditRounds(ctx context.Context, q AuditHistoryQuery) ([]AuditRound, error) {
	rows, err := l.db.Query(ctx, `SELECT r.round_id, r.at, r.took_ms, r.ok, r.skus, r.error, r.violations FROM audit_rounds r
		WHERE r.at >= $1 AND ($2 = 0 OR r.round_id < $2)
		  AND ($3 = '' OR r.error <> '' OR EXISTS (SELECT 1 FROM audit_round_sales s WHERE s.round_id = r.round_id AND s.sale_id = $3))
		ORDER BY r.round_id DESC LIMIT $4`, q.Since, q.Before, q.Sale, q.Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditRound, error) {
		var r AuditRound
		var took int64
		var vj []byte
		if err := row.Scan(&r.ID, &r.At, &took, &r.OK, &r.SKUs, &r.Error, &vj); err != nil {
			return r, err
		}
		r.Took = time.Duration(took) * time.Millisecond
		var vs []roundViolation
		if err := json.Unmarshal(vj, &vs); err != nil {
			return r, fmt.Errorf("round %d's violations: %w", r.ID, err)
		}
		for _, v := range vs {
			if q.Sale == "" || v.Sale == "" || v.Sale == q.Sale {
				r.Violations = append(r.Violations, Violation{v.Invariant, v.Sale, v.SKU, v.Region, v.Detail})
			}
		}
		return r, nil
	})
}

// roundSales reads the sales' results of rounds (of sale alone when set) into them.
func (l *ledger) roundSales(ctx context.Context, sale string, rounds []AuditRound) error {
	if len(rounds) == 0 {
		return nil
	}
	ids := make([]int64, len(rounds))
	at := make(map[int64]int, len(rounds))
	for i, r := range rounds {
		ids[i], at[r.ID] = r.ID, i
	}
	rows, err := l.db.Query(ctx, `SELECT round_id, sale_id, ok, skus FROM audit_round_sales
		WHERE round_id = ANY($1) AND ($2 = '' OR sale_id = $2) ORDER BY round_id, sale_id`, ids, sale)
	if err != nil {
		return err
	}
	var id int64
	var s AuditRoundSale
	var kj []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &s.Sale, &s.OK, &kj}, func() error {
		var ks []roundSKU
		if err := json.Unmarshal(kj, &ks); err != nil {
			return fmt.Errorf("round %d's sale %s: %w", id, s.Sale, err)
		}
		rs := AuditRoundSale{Sale: s.Sale, OK: s.OK}
		for _, k := range ks {
			rs.SKUs = append(rs.SKUs, k.audit(s.Sale))
		}
		rounds[at[id]].Sales = append(rounds[at[id]].Sales, rs)
		return nil
	})
	return err
}
