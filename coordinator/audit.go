package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/puddle/v2"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// RegionAudit is one region's pool of one SKU in an audit.
type RegionAudit struct {
	Region                                        string
	Available, Held, Sold, CreditedIn, DebitedOut transfer.Units
	Reachable                                     bool
	Error                                         string
}

// SKUAudit is I1 for one SKU with every term.
type SKUAudit struct {
	Sale, SKU                                                     string
	Total, Unallocated, Available, Held, Sold, InFlight, Stranded transfer.Units
	Regions                                                       []RegionAudit
	OK                                                            bool
	stale                                                         bool // a region knew a transfer the ledger snapshot did not, or a credit before its debit
}

// Violation is one broken invariant with its evidence.
type Violation struct {
	Invariant, Sale, SKU, Region, Detail string
}

// Report is the result of an audit.
type Report struct {
	OK         bool
	SKUs       []SKUAudit
	Violations []Violation
	At         time.Time
	// Pauses are the audited sales' pauses in force, read after the audit: the continuous
	// audit's (auditor.loop) carry their evidence in the reason. They are no violation.
	Pauses []Pause
}

// auditReads is how many times an audit reads the ledger and the regions before it gives up
// on getting views that agree.
const auditReads = 8

type ledgerSnapshot struct {
	sales     []string
	skus      map[string][]SKULedger // sale → skus
	transfers map[string]transfer.Transfer
}

// Audit checks I1 for every SKU (of one sale, or all) and I2, I3 and I5 for every region
// pool, reading the ledger and each region's database directly. The ledger is read first,
// then the regions; a region record the ledger snapshot does not know yet (a transfer that
// started in between) makes the audit read both again, so a running sale or transfer never
// produces a false alarm. An unreadable region is reported as a violation: conservation
// cannot be proven without it.
func (c *Coordinator) Audit(ctx context.Context, sale string) (Report, error) {
	return c.audit.run(ctx, sale)
}

// run is Audit.
func (au *auditor) run(ctx context.Context, sale string) (Report, error) {
	if sale != "" {
		if err := checkSaleID(sale); err != nil {
			return Report{}, err
		}
	}
	var rep Report
	for attempt := 1; ; attempt++ {
		snap, err := au.readLedger(ctx, sale)
		if err != nil {
			return Report{}, err
		}
		if sale != "" && len(snap.sales) == 0 {
			return Report{}, apierr.NotFound("sale_id", sale)
		}
		books := au.readRegions(ctx, snap.sales)
		if err := closedOwnPool(books); err != nil {
			return Report{}, err
		}
		var stale bool
		final := attempt == auditReads
		rep, stale = evaluate(snap, books, au.cfg.Regions, final)
		if !stale {
			break
		}
		if final {
			// The snapshots never agreed: say so rather than guess either way.
			rep.OK = false
			rep.Violations = append(rep.Violations, Violation{Invariant: "I1", Sale: sale,
				Detail: fmt.Sprintf("region records and the ledger disagreed in %d reads (a transfer the ledger does not know, or a credit without its debit): conservation unproven", auditReads)})
			break
		}
		time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
	}
	rep.At = au.cfg.Clock.Now()
	pauses, err := au.ledger.pauses(ctx, sale)
	if err != nil {
		return Report{}, err
	}
	for _, p := range pauses {
		if p.Paused {
			rep.Pauses = append(rep.Pauses, p)
		}
	}
	return rep, nil
}

// closedOwnPool is an error when a region's books could not be read because this process
// closed its own pool to that database, as it does when it stops: that says nothing about
// the region's books, so the audit fails (the caller may ask another coordinator) instead
// of reporting I1 unproven.
func closedOwnPool(books map[string]map[string]regionRead) error {
	for region, reads := range books {
		for _, rr := range reads {
			if errors.Is(rr.err, puddle.ErrClosedPool) {
				return fmt.Errorf("audit: this coordinator's pool to region %s's database is closed (it is stopping): %w", region, rr.err)
			}
		}
	}
	return nil
}

func (au *auditor) readLedger(ctx context.Context, sale string) (ledgerSnapshot, error) {
	var snap ledgerSnapshot
	err := pgutil.ReadTx(ctx, au.ledger.db, func(tx pgx.Tx) error {
		snap = ledgerSnapshot{skus: map[string][]SKULedger{}, transfers: map[string]transfer.Transfer{}}
		rows, err := tx.Query(ctx, `SELECT sale_id, sku, total, unallocated FROM skus WHERE $1 = '' OR sale_id = $1 ORDER BY sale_id, sku`, sale)
		if err != nil {
			return err
		}
		for rows.Next() {
			var s string
			var k SKULedger
			var total, un int64
			if err := rows.Scan(&s, &k.SKU, &total, &un); err != nil {
				return err
			}
			k.Total, k.Unallocated = transfer.Units(total), transfer.Units(un)
			if len(snap.skus[s]) == 0 {
				snap.sales = append(snap.sales, s)
			}
			snap.skus[s] = append(snap.skus[s], k)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE $1 = '' OR sale_id = $1`, sale)
		if err != nil {
			return err
		}
		ts, err := pgx.CollectRows(rows, scanTransfer)
		for _, t := range ts {
			snap.transfers[t.ID] = t
		}
		return err
	})
	if err != nil {
		return snap, fmt.Errorf("read ledger: %w", err)
	}
	return snap, nil
}

type regionRead struct {
	books transfer.RegionBooks
	err   error
}

// readRegions reads every region's books of every sale, regions in parallel.
func (au *auditor) readRegions(ctx context.Context, sales []string) map[string]map[string]regionRead {
	out := map[string]map[string]regionRead{}
	type result struct {
		region string
		reads  map[string]regionRead
	}
	ch := make(chan result, len(au.cfg.Regions))
	for _, r := range au.cfg.Regions {
		go func(r RegionLink) { ch <- result{r.Name, readBooks(ctx, r, sales)} }(r)
	}
	for range au.cfg.Regions {
		res := <-ch
		out[res.region] = res.reads
	}
	return out
}

// readBooks reads one region's books of every sale: transfer.MaxBooksSales at a time when the link
// reads many at once, else one by one; each read bounded by booksTimeout.
func readBooks(ctx context.Context, r RegionLink, sales []string) map[string]regionRead {
	reads := make(map[string]regionRead, len(sales))
	if r.BooksOf == nil {
		for _, s := range sales {
			rctx, cancel := context.WithTimeout(ctx, booksTimeout)
			b, err := r.Books(rctx, s)
			cancel()
			reads[s] = regionRead{books: b, err: err}
		}
		return reads
	}
	for chunk := range slices.Chunk(sales, transfer.MaxBooksSales) {
		rctx, cancel := context.WithTimeout(ctx, booksTimeout)
		books, err := r.BooksOf(rctx, chunk)
		cancel()
		for _, s := range chunk {
			reads[s] = regionRead{books: books[s], err: err}
		}
	}
	return reads
}

// booksTimeout bounds one read of a region's books.
const booksTimeout = 10 * time.Second
