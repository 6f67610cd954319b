package region

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sweeper is the leader's housekeeping on the writer: it expires holds past their deadline
// and moves the holds closed past the retention to the archive (archiver.go).
type sweeper struct {
	cfg  *Config
	pool *pgxpool.Pool
}

// sweep expires holds past their deadline, in batches through the writer, until ctx ends.
// When a sweep fills its batch it goes again at once. Then it moves the holds closed past the
// retention to the archive (archiveTick).
func (r *sweeper) sweep(ctx context.Context, w *writer) {
	t := time.NewTicker(r.cfg.Sweep.Interval)
	defer t.Stop()
	var nextArchive time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := submit[int](ctx, w, &expireOp{limit: r.cfg.Sweep.Batch, region: r.cfg.Name})
			if err != nil {
				if ctx.Err() == nil {
					r.cfg.Logger.Warn("sweep failed", "region", r.cfg.Name, "err", err)
				}
				break
			}
			if n < r.cfg.Sweep.Batch {
				break
			}
		}
		r.archiveTick(ctx, w, &nextArchive)
	}
}

// archiveIdleEvery is how often the sweeper looks for holds to archive while the last look
// found none: a hold waits at most this much past its retention, and an idle region's
// database is asked once in that time, not at every sweep.
const archiveIdleEvery = 10 * time.Second

// archiveTick moves holds due to the archive (archiver.go) unless next is still ahead, for at
// most half the sweep interval, so that over a backlog (the history still in holds after the
// migration that added the archive) the next sweep's expiries still come on time. While it
// finds holds to move it looks again at the next sweep; otherwise after archiveIdleEvery.
func (r *sweeper) archiveTick(ctx context.Context, w *writer, next *time.Time) {
	if time.Now().Before(*next) {
		return
	}
	n, err := r.archive(ctx, func(ctx context.Context, o op[int]) (int, error) { return submit(ctx, w, o) }, r.cfg.Sweep.Interval/2)
	if err != nil && ctx.Err() == nil {
		r.cfg.Logger.Warn("archiving closed holds failed", "region", r.cfg.Name, "err", err)
	}
	if n == 0 {
		*next = time.Now().Add(archiveIdleEvery)
	}
}

// SweepNow expires every hold past its deadline now and returns how many it expired. Tests
// and operators use it instead of waiting for the next tick.
func (r *Region) SweepNow(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := submitOp[int](ctx, r.leadership, &expireOp{limit: r.cfg.Sweep.Batch, region: r.cfg.Name})
		if err != nil {
			return total, err
		}
		total += n
		if n < r.cfg.Sweep.Batch {
			return total, nil
		}
	}
}
