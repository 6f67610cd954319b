package coordinator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// SKUTotal is one SKU of a new sale and its total stock.
type SKUTotal struct {
	SKU   string
	Total transfer.Units
}

// SaleSpec defines a new sale.
type SaleSpec struct {
	Sale         string
	SKUs         []SKUTotal
	PerUserLimit transfer.Units
	HoldTTL      time.Duration
	// OpensAt zero means open at once.
	OpensAt time.Time
	// Admission is the sale's waiting room (zero: none); unset TicketTTL and MaxLive take
	// their defaults (transfer.AdmissionTerms.WithDefaults).
	Admission transfer.AdmissionTerms
	// Rebalance is whether the automatic rebalancer moves the sale's stock ("": auto).
	Rebalance RebalanceMode
}

// SKULedger is one SKU's ledger counts.
type SKULedger struct {
	SKU         string
	Total       transfer.Units
	Unallocated transfer.Units
	// Allocated is the units posted to each region from the unallocated pool.
	Allocated map[string]transfer.Units
}

// Sale is a sale as the ledger knows it.
type Sale struct {
	Terms     SaleTerms
	SKUs      []SKULedger
	CreatedAt time.Time
	// Pauses are the sale's pauses in force, and its resumes some region lacks (pause.go).
	Pauses []Pause
	// Rebalance is whether the automatic rebalancer moves the sale's stock.
	Rebalance RebalanceMode
}

// checkSaleID refuses a malformed sale id as INVALID_ARGUMENT on field sale_id.
func checkSaleID(sale string) error {
	if why := transfer.CheckID(sale); why != "" {
		return apierr.Invalid("sale_id", "%s", why)
	}
	return nil
}

// Check validates a sale definition, naming the bad field.
func (s SaleSpec) Check() error {
	if err := checkSaleID(s.Sale); err != nil {
		return err
	}
	if len(s.SKUs) == 0 {
		return apierr.Invalid("skus", "a sale needs at least one SKU")
	}
	if len(s.SKUs) > 1000 {
		return apierr.Invalid("skus", "%d SKUs; at most 1000", len(s.SKUs))
	}
	seen := map[string]bool{}
	for _, k := range s.SKUs {
		if why := transfer.CheckID(k.SKU); why != "" {
			return apierr.Invalid("sku", "%s", why)
		}
		if seen[k.SKU] {
			return apierr.Invalid("sku", "%q listed twice", k.SKU)
		}
		seen[k.SKU] = true
		if k.Total <= 0 || k.Total > transfer.MaxUnits {
			return apierr.Invalid("total", "sku %s: must be 1..%d, got %d", k.SKU, transfer.MaxUnits, k.Total)
		}
	}
	if s.PerUserLimit <= 0 || s.PerUserLimit > transfer.MaxUnits {
		return apierr.Invalid("per_user_limit", "must be 1..%d, got %d", transfer.MaxUnits, s.PerUserLimit)
	}
	if s.HoldTTL < time.Second || s.HoldTTL > 24*time.Hour {
		return apierr.Invalid("hold_ttl", "must be 1s..24h, got %s", s.HoldTTL)
	}
	if field, why := s.Admission.WithDefaults().Check(); field != "" {
		return apierr.Invalid(field, "%s", why)
	}
	return CheckRebalanceMode(s.Rebalance)
}

func (s SaleSpec) definition() string {
	var admit *transfer.AdmissionTerms // absent for a sale without a waiting room
	if a := s.Admission.WithDefaults(); a.Waiting() {
		admit = &a
	}
	b, _ := json.Marshal(struct {
		SKUs    []SKUTotal
		Limit   transfer.Units
		TTL     time.Duration
		OpensAt int64
		Admit   *transfer.AdmissionTerms `json:",omitempty"`
		// Absent for auto, so a sale created before modes existed keeps its definition.
		Rebalance RebalanceMode `json:",omitempty"`
	}{s.SKUs, s.PerUserLimit, s.HoldTTL, openMillis(s.OpensAt), admit, s.Rebalance})
	return string(b)
}

// CreateSale records a sale with every SKU's units unallocated. Creating the same sale again
// with the same definition returns it (replayed); another definition is ErrAlreadyExists.
func (c *Coordinator) CreateSale(ctx context.Context, spec SaleSpec) (Sale, bool, error) {
	if err := spec.Check(); err != nil {
		return Sale{}, false, err
	}
	gen, err := c.Generation()
	if err != nil {
		return Sale{}, false, err
	}
	now := c.cfg.Clock.Now()
	spec.OpensAt = spec.OpensAt.Truncate(time.Millisecond)
	spec.Admission = spec.Admission.WithDefaults()
	spec.Admission.TicketTTL = spec.Admission.TicketTTL.Truncate(time.Millisecond)
	if spec.Rebalance == RebalanceAuto {
		spec.Rebalance = "" // the default, named or not, is one definition
	}
	def := spec.definition() // before the default: a retry without opens_at is the same sale
	if spec.OpensAt.IsZero() {
		spec.OpensAt = now.Truncate(time.Millisecond)
	}
	replayed := false
	err = c.ledger.fencedTx(ctx, gen, func(tx pgx.Tx) error {
		replayed = false
		var have string
		err := tx.QueryRow(ctx, `SELECT definition FROM sales WHERE sale_id = $1`, spec.Sale).Scan(&have)
		if err == nil {
			if have != def {
				return fmt.Errorf("sale_id %q was created before with another definition: %w", spec.Sale, ErrAlreadyExists)
			}
			replayed = true
			return nil
		}
		if err != pgx.ErrNoRows {
			return err
		}
		a := spec.Admission
		if _, err := tx.Exec(ctx, `INSERT INTO sales (sale_id, per_user_limit, hold_ttl_ms, opens_at, created_at, definition,
			admit_rate, ticket_ttl_ms, max_live_tickets, rebalance, room_return_url) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			spec.Sale, int64(spec.PerUserLimit), spec.HoldTTL.Milliseconds(), spec.OpensAt, now, def,
			a.Rate, a.TicketTTL.Milliseconds(), a.MaxLive, string(cmp.Or(spec.Rebalance, RebalanceAuto)), a.ReturnURL); err != nil {
			return err
		}
		for _, k := range spec.SKUs {
			if _, err := tx.Exec(ctx, `INSERT INTO skus (sale_id, sku, total, unallocated) VALUES ($1, $2, $3, $3)`,
				spec.Sale, k.SKU, int64(k.Total)); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO terms_undelivered (sale_id, region) SELECT $1, unnest($2::text[])`,
			spec.Sale, c.regions.names())
		return err
	})
	if isUniqueViolation(err) {
		// A concurrent CreateSale of the same id won; compare against what it wrote.
		return c.CreateSale(ctx, spec)
	}
	if err != nil {
		return Sale{}, false, err
	}
	s, err := c.GetSale(ctx, spec.Sale)
	if err == nil {
		c.terms.announce(ctx, gen, s.Terms)
	}
	return s, replayed, err
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// saleMustExist is NOT_FOUND for a sale the ledger does not have, so that "no such SKU" or
// "no transfers" does not hide a mistyped sale id. q is the pool or a transaction.
func saleMustExist(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sale string) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sales WHERE sale_id = $1)`, sale).Scan(&exists); err != nil {
		return fmt.Errorf("read sale: %w", err)
	}
	if !exists {
		return apierr.NotFound("sale_id", sale)
	}
	return nil
}

// GetSale reads a sale and its SKUs' ledger counts.
func (c *Coordinator) GetSale(ctx context.Context, sale string) (Sale, error) {
	return c.ledger.sale(ctx, sale)
}

// sale reads a sale and its SKUs' ledger counts.
func (l *ledger) sale(ctx context.Context, sale string) (Sale, error) {
	if err := checkSaleID(sale); err != nil {
		return Sale{}, err
	}
	s := Sale{Terms: SaleTerms{Sale: sale}}
	var limit, ttl, ticketTTL int64
	a := &s.Terms.Admission
	err := l.db.QueryRow(ctx, `SELECT per_user_limit, hold_ttl_ms, opens_at, created_at, admit_rate, ticket_ttl_ms, max_live_tickets, rebalance,
		room_return_url FROM sales WHERE sale_id = $1`, sale).Scan(&limit, &ttl, &s.Terms.OpensAt, &s.CreatedAt, &a.Rate, &ticketTTL, &a.MaxLive,
		&s.Rebalance, &a.ReturnURL)
	if err == pgx.ErrNoRows {
		return s, apierr.NotFound("sale_id", sale)
	}
	if err != nil {
		return s, fmt.Errorf("read sale: %w", err)
	}
	s.Terms.PerUserLimit, s.Terms.HoldTTL = transfer.Units(limit), time.Duration(ttl)*time.Millisecond
	a.TicketTTL = time.Duration(ticketTTL) * time.Millisecond
	rows, err := l.db.Query(ctx, `SELECT k.sku, k.total, k.unallocated, t.to_pool, coalesce(sum(t.units), 0)
		FROM skus k LEFT JOIN transfers t ON t.sale_id = k.sale_id AND t.sku = k.sku AND t.state = 'posted' AND t.from_pool = $2
		WHERE k.sale_id = $1 GROUP BY k.sku, k.total, k.unallocated, t.to_pool ORDER BY k.sku`, sale, transfer.Unallocated)
	if err != nil {
		return s, fmt.Errorf("read skus: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var sku string
		var to *string
		var total, unalloc, units int64
		if err := rows.Scan(&sku, &total, &unalloc, &to, &units); err != nil {
			return s, err
		}
		if n := len(s.SKUs); n == 0 || s.SKUs[n-1].SKU != sku {
			s.SKUs = append(s.SKUs, SKULedger{SKU: sku, Total: transfer.Units(total), Unallocated: transfer.Units(unalloc), Allocated: map[string]transfer.Units{}})
			s.Terms.SKUs = append(s.Terms.SKUs, sku)
		}
		if to != nil {
			s.SKUs[len(s.SKUs)-1].Allocated[*to] = transfer.Units(units)
		}
	}
	if err := rows.Err(); err != nil {
		return s, err
	}
	rows.Close()
	s.Pauses, err = l.pauses(ctx, sale)
	return s, err
}

func openMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
