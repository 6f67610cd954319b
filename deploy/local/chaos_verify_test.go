package local_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/quotaworks/quota/internal/linearize"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// checkAudit: the audit is clean, I1 adds up exactly for every SKU and nothing is oversold.
func (r *chaosRun) checkAudit() int {
	out, err := r.coordinatorCall("audit", "-o", "json")
	var a auditOut
	if jerr := json.Unmarshal([]byte(out), &a); jerr != nil {
		r.t.Errorf("VIOLATION audit: %v / %v\n%s", err, jerr, out)
		return 1
	}
	violations := len(a.Violations)
	if err != nil || !a.OK || violations != 0 {
		r.t.Errorf("VIOLATION audit not ok (%v):\n%s", err, out)
		violations = max(violations, 1)
	}
	for _, s := range a.SKUs {
		sum := s.Unallocated + s.Available + s.Held + s.Sold + s.InFlight
		r.t.Logf("audit %s/%s: total %d = unallocated %d + available %d + held %d + sold %d + in flight %d",
			s.Sale, s.SKU, s.Total, s.Unallocated, s.Available, s.Held, s.Sold, s.InFlight)
		if sum != s.Total || !s.OK {
			r.t.Errorf("VIOLATION I1 %s/%s: %d ≠ total %d", s.Sale, s.SKU, sum, s.Total)
			violations++
		}
		if s.Held+s.Sold > s.Total || s.Available < 0 || s.Held < 0 || s.Sold < 0 {
			r.t.Errorf("VIOLATION oversold %s/%s: held %d + sold %d of %d", s.Sale, s.SKU, s.Held, s.Sold, s.Total)
			violations++
		}
	}
	return violations
}

// checkLoadHolds: every hold the buyers were granted is at its region, held or sold, and at
// least as many are sold as confirms were acknowledged.
func (r *chaosRun) checkLoadHolds() int {
	if r.loadErr != nil {
		r.t.Errorf("load: %v", r.loadErr)
	}
	ids := make(chan [2]string)
	var (
		mu   sync.Mutex
		bad  []string
		sold int64
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for id := range ids {
				var res *quotav1.Reservation
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := r.regions[id[1]].call(ctx, 10*time.Second, func(ctx context.Context, cl quotav1.RegionServiceClient) error {
					g, err := cl.GetReservation(ctx, &quotav1.GetReservationRequest{HoldId: id[0]})
					res = g.GetReservation()
					return err
				})
				cancel()
				mu.Lock()
				switch st := res.GetState(); {
				case err != nil:
					bad = append(bad, fmt.Sprintf("%s at %s: %v", id[0], id[1], err))
				case st == quotav1.HoldState_HOLD_STATE_SOLD:
					sold++
				case st != quotav1.HoldState_HOLD_STATE_HELD:
					bad = append(bad, fmt.Sprintf("%s at %s: %s", id[0], id[1], st))
				}
				mu.Unlock()
			}
		})
	}
	for id, region := range r.load.Holds {
		ids <- [2]string{id, region}
	}
	close(ids)
	wg.Wait()
	r.ops.holdsChecked += len(r.load.Holds)
	for i, b := range bad {
		if i < 20 {
			r.t.Errorf("VIOLATION I6 acknowledged hold: %s", b)
		}
	}
	if sold < r.load.Confirmed {
		r.t.Errorf("VIOLATION I6: %d acknowledged holds sold, %d confirms acknowledged", sold, r.load.Confirmed)
		bad = append(bad, "sold")
	}
	return len(bad)
}

// checkLinearizable checks each pool's history with porcupine; Unknown (the checker ran out
// of time) is reported, not passed.
func (r *chaosRun) checkLinearizable() int {
	violations, ok := 0, 0
	for _, p := range r.pools {
		res, bad := r.checkPool(p)
		if res == string(porcupine.Ok) {
			ok++
		}
		r.linResult = res
		violations += bad
	}
	if len(r.pools) > 1 {
		r.linResult = fmt.Sprintf("%d/%d pools Ok", ok, len(r.pools))
	}
	return violations
}

// checkPool checks one pool's history, within linEpisode (its history covers about that long).
func (r *chaosRun) checkPool(p linPool) (string, int) {
	h := p.rec.History()
	ops, unk := p.rec.Stats()
	r.ops.linOps, r.ops.linUnk = r.ops.linOps+ops, r.ops.linUnk+unk
	start := time.Now()
	res, info := linearize.Check(linearize.Pool{Units: linUnits, Limit: linLimit}, h, linEpisode)
	r.t.Logf("porcupine, %s: %s for %d operations (%d with an unknown outcome) in %s", p.sale, res, len(h), unk,
		time.Since(start).Round(time.Millisecond))
	if res == porcupine.Ok {
		return string(res), 0
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-lin-%d-%s.html", r.seed, p.sale))
	if err := linearize.Visualize(linearize.Pool{Units: linUnits, Limit: linLimit}, info, path); err != nil {
		r.t.Log(err)
	}
	if res == porcupine.Illegal {
		r.t.Errorf("VIOLATION linearizability: the history of %s/item at eu is not linearizable (visualization %s)", p.sale, path)
		return string(res), 1
	}
	r.t.Errorf("linearizability: porcupine gave no answer for %s within %s (visualization %s)", p.sale, linEpisode, path)
	return string(res), 0
}

// report prints the figures with t.Log and on stdout, and to $QUOTA_CHAOS_REPORT when set.
func (r *chaosRun) report(violations int, wall time.Duration) {
	n := r.nem.counts
	o := &r.ops
	lin := fmt.Sprintf("%s (%d ops, %d unknown)", r.linResult, o.linOps, o.linUnk)
	var reserves, confirms, releases int
	for _, w := range r.workers {
		reserves += w.counts[linearize.Reserve]
		confirms += w.counts[linearize.Confirm]
		releases += w.counts[linearize.Release]
	}
	line := fmt.Sprintf("CHAOS: seed=%d duration=%s wall=%s faults: kill=%d pause=%d cut=%d blackhole=%d slow=%d "+
		"ops: reserves=%d confirms=%d releases=%d transfers=%d/%d rebalances=%d/%d acknowledged holds checked=%d "+
		"transfers posted/voided/stranded=%d/%d/%d region takeovers warm/full=%s violations=%d linearizability=%s",
		r.seed, r.duration, wall.Round(time.Second), n["kill"], n["pause"], n["cut"], n["blackhole"], n["slow"],
		r.load.Buyers+int64(reserves), r.load.Confirmed+r.load.Refunded+int64(confirms), releases,
		o.transfersAcked, o.transfers, o.rebalancesAcked, o.rebalances, o.holdsChecked,
		o.posted, o.voided, o.stranded, r.takeovers(), violations, lin)
	r.t.Log(line)
	fmt.Println(line)
	if p := os.Getenv("QUOTA_CHAOS_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(line+"\n"), 0o644); err != nil {
			r.t.Logf("QUOTA_CHAOS_REPORT: %v", err)
		}
	}
}

// takeovers counts, in the region processes' logs, the terms that started from a standby's
// warm copy and those that loaded every hold ("region leading" ... load=warm or load=full).
func (r *chaosRun) takeovers() string {
	logs, err := filepath.Glob(filepath.Join(r.c.dir, "region-*.log"))
	if err != nil || len(logs) == 0 {
		return "?"
	}
	var warm, full int
	for _, p := range logs {
		b, err := os.ReadFile(p)
		if err != nil {
			return "?"
		}
		for _, line := range linesWith(string(b), `msg="region leading"`) {
			switch {
			case strings.Contains(line, "load=warm"):
				warm++
			case strings.Contains(line, "load=full"):
				full++
			}
		}
	}
	return fmt.Sprintf("%d/%d", warm, full)
}
