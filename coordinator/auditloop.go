package coordinator

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// DefaultAuditInterval is how often quotad's coordinator audits every sale unless told
// otherwise (--audit-interval).
const DefaultAuditInterval = 10 * time.Second

// auditPausePrefix starts the reason of every pause the continuous audit makes.
const auditPausePrefix = "audit: "

// auditor audits global conservation against every region's books: on demand (run, the
// facade's Audit) and, while this coordinator leads, every AuditInterval (loop), pausing
// through pause (the facade's SetPaused) each SKU whose I1 sum is broken.
type auditor struct {
	cfg    *Config
	ledger *ledger
	pause  func(context.Context, PauseChange) (PauseResult, error)
	// violations is the continuous audit's last count of violations in this term, auditedAt
	// when that round ended (Unix nanoseconds; 0: no round yet), and took the last round's
	// duration in nanoseconds: what the continuous audit costs.
	violations, auditedAt, took atomic.Int64
}

// newTerm forgets the rounds of an earlier term: a count of one is no news of this one.
func (au *auditor) newTerm() {
	au.violations.Store(0)
	au.auditedAt.Store(0)
	au.took.Store(0)
}

// loop audits every sale every AuditInterval while this coordinator leads, and pauses
// each SKU whose conservation (I1) the audit finds broken in every region, through the same
// kill switch as an operator's pause (SetPaused), with the evidence as the pause's reason.
// Every round, and the error of one that could not run, is stored in the ledger under gen
// (audithistory.go), and the rounds older than AuditRetention are pruned.
func (au *auditor) loop(ctx context.Context, gen int64) {
	if au.cfg.AuditInterval <= 0 {
		return
	}
	every(ctx, au.cfg.AuditInterval, func() { au.round(ctx, gen) })
}

// round is one round of loop.
func (au *auditor) round(ctx context.Context, gen int64) {
	start := time.Now()
	rep, err := au.run(ctx, "")
	took := time.Since(start)
	if ctx.Err() != nil {
		return // stepping down: no round to tell of
	}
	au.took.Store(int64(took)) // a round that failed counts too: slow or failing is what it tells
	au.remember(ctx, gen, rep, err, took)
	if err != nil {
		au.cfg.Logger.Warn("continuous audit could not run", "err", err)
		return
	}
	au.violations.Store(int64(len(rep.Violations)))
	au.auditedAt.Store(time.Now().UnixNano())
	for _, v := range rep.Violations {
		if breach(v) {
			au.pauseForBreach(ctx, v, rep)
		} else {
			au.cfg.Logger.Warn("continuous audit: violation", "invariant", v.Invariant, "sale", v.Sale, "sku", v.SKU,
				"region", v.Region, "evidence", v.Detail)
		}
	}
}

// remember stores the round in the ledger and prunes the expired ones; a failure is logged,
// and the audit goes on (its pauses matter more than its memory).
func (au *auditor) remember(ctx context.Context, gen int64, rep Report, runErr error, took time.Duration) {
	if err := au.record(ctx, gen, rep, runErr, took); err != nil {
		au.cfg.Logger.Warn("continuous audit: could not store the round", "err", err)
		return
	}
	if err := au.prune(ctx, gen); err != nil {
		au.cfg.Logger.Warn("continuous audit: could not prune old rounds", "err", err)
	}
}

// breach tells whether a violation proves a SKU's conservation broken: the I1 sum of a SKU
// whose every region was read. An unreadable region ("conservation unproven") or views that
// never agreed prove nothing about the stock and pause nothing: a database that does not
// answer for a moment must not stop a sale. Both stay in the report (quotactl audit) and
// are logged by round.
func breach(v Violation) bool {
	return v.Invariant == "I1" && v.SKU != "" && v.Region == ""
}

// pauseForBreach pauses v's SKU in every region, unless the SKU's own pause is in force
// already, and logs the evidence at error level.
func (au *auditor) pauseForBreach(ctx context.Context, v Violation, rep Report) {
	var paused bool
	err := au.ledger.db.QueryRow(ctx, `SELECT paused FROM pauses WHERE sale_id = $1 AND sku = $2`, v.Sale, v.SKU).Scan(&paused)
	if err != nil && err != pgx.ErrNoRows {
		au.cfg.Logger.Warn("continuous audit: read pause", "sale", v.Sale, "sku", v.SKU, "err", err)
		return
	}
	if paused {
		au.cfg.Logger.Debug("continuous audit: I1 still broken; the SKU is paused", "sale", v.Sale, "sku", v.SKU, "evidence", v.Detail)
		return
	}
	// The evidence quotes stored data: made text a pause accepts, so the pause cannot be refused.
	reason := transfer.AsText(auditPausePrefix+"I1 violation: "+v.Detail, transfer.MaxReasonLen)
	args := []any{"sale", v.Sale, "sku", v.SKU, "evidence", v.Detail}
	for _, a := range rep.SKUs {
		if a.Sale == v.Sale && a.SKU == v.SKU {
			args = append(args, "total", a.Total, "unallocated", a.Unallocated, "available", a.Available,
				"held", a.Held, "sold", a.Sold, "in_flight", a.InFlight, "regions", a.Regions)
		}
	}
	au.cfg.Logger.Error("continuous audit: conservation (I1) broken; pausing the SKU in every region", args...)
	res, err := au.pause(ctx, PauseChange{Sale: v.Sale, SKU: v.SKU, Paused: true, Reason: reason})
	if err != nil {
		au.cfg.Logger.Error("continuous audit: could not pause the SKU", "sale", v.Sale, "sku", v.SKU, "err", err)
		return
	}
	if len(res.Unreached) > 0 {
		au.cfg.Logger.Error("continuous audit: SKU paused, but not every region has it yet; the coordinator keeps trying",
			"sale", v.Sale, "sku", v.SKU, "unreached", res.Unreached)
	}
}
