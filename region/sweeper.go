package region

import (
	"context"
	"time"
)

// sweep expires holds past their deadline, in batches through the writer, until ctx ends.
// When a sweep fills its batch it goes again at once. Then it moves the holds closed past the
// retention to the archive (archiver.go), for at most half the sweep interval, so that over a
// backlog (the history still in holds after the migration that added the archive) the next
// sweep's expiries still come on time.
func (r *Region) sweep(ctx context.Context, w *writer) {
	defer r.wg.Done()
	t := time.NewTicker(r.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := w.submit(ctx, &expireOp{limit: r.cfg.SweepBatch, region: r.cfg.Name})
			if err != nil {
				if ctx.Err() == nil {
					r.cfg.Logger.Warn("sweep failed", "region", r.cfg.Name, "err", err)
				}
				break
			}
			if n.(int) < r.cfg.SweepBatch {
				break
			}
		}
		if _, err := r.archive(ctx, w.submit, r.cfg.SweepInterval/2); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("archiving closed holds failed", "region", r.cfg.Name, "err", err)
		}
	}
}

// SweepNow expires every hold past its deadline now and returns how many it expired. Tests
// and operators use it instead of waiting for the next tick.
func (r *Region) SweepNow(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := r.submit(ctx, &expireOp{limit: r.cfg.SweepBatch, region: r.cfg.Name})
		if err != nil {
			return total, err
		}
		total += n.(int)
		if n.(int) < r.cfg.SweepBatch {
			return total, nil
		}
	}
}
