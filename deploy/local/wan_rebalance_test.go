package local_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"

	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// The automatic rebalancer's sale with every buyer at one region (ap, the farthest from the
// coordinators in us), on a cluster without delays and on one with `up --wan`: whether ap
// alone sells the whole stock, how long that takes, how long ap waits for units each time
// it runs dry, and how long every region takes to answer SOLD_OUT once the last unit is sold.
const (
	rebalanceUnits   = 300                   // us 120, eu 105, ap 75 (40/35/25)
	rebalancePace    = 40 * time.Millisecond // a buyer arrives at ap every 40 ms (25 a second)
	rebalanceInFlt   = 32                    // at most this many buyers at once (each binds with --wan: about 0.6 s)
	rebalanceLimit   = 3 * time.Minute       // the buyers' arrivals stop by then, sold out or not
	rebalanceStatusT = 20 * time.Millisecond // each region's sale status is read this often
	rebalanceShare   = 0.995                 // the operators' acceptance: ap sells at least this share
	rebalanceRatio   = 1.3                   // the sell-out time with --wan within this of without (reported)
)

// buyEvent is one buyer at ap: when its reservation was sent, when it was answered (for a
// sold unit: when the confirm was), and how: "sold" or the error code.
type buyEvent struct {
	sent, answered time.Time
	outcome        string
}

// rebalanceFigures are one run's figures.
type rebalanceFigures struct {
	sold, buyers int
	refused      map[string]int // buyers not sold a unit, by the answer's code
	// sellOut is the first buyer to the first SOLD_OUT answer at ap; lastSold the first buyer
	// to the last unit sold (confirmed); 0 when it did not happen.
	sellOut, lastSold time.Duration
	// dry is each spell ap ran dry and was fed again: from the first buyer told
	// REGION_EXHAUSTED to the first one after it sold a unit (buyers in order of arrival).
	dry []time.Duration
	// tail is the buyers told REGION_EXHAUSTED in ap's last dry spell, the one no unit ended
	// (from the last unit sold until SOLD_OUT, when the sale sold out).
	tail int
	// soldOut is, per region, the last unit sold to the region's DescribeSale first saying
	// the SKU is sold out; missing when it never did.
	soldOut map[string]time.Duration
	moves   []autoMove
}

// autoMove is one automatic transfer as the ledger recorded it: when (from the first buyer),
// and how long until it was posted (0 when it was not).
type autoMove struct {
	from, to      string
	units         int
	start, posted time.Duration
}

// String is the move as a report shows it: from>to units at start, posted after.
func (m autoMove) String() string {
	return fmt.Sprintf("%s>%s %d at %s (posted after %s)", m.from, m.to, m.units, m.start.Round(time.Millisecond), m.posted.Round(time.Millisecond))
}

// TestLocalWANRebalance runs the automatic rebalancer's sale at one region of three on a
// cluster without delays and on one with `up --wan` (default delays): rebalanceUnits units
// allocated 40/35/25 over us, eu and ap, and every buyer at ap's HTTP edge, one arriving every
// rebalancePace (reserve, then confirm), until ap answers SOLD_OUT. It fails unless ap sells
// at least 99.5 % of the units in both runs (the operators' acceptance) and the audit is
// clean, and it reports side by side the time to sell out and its ratio (wan / loopback;
// the aim is at most 1.3), ap's dry spells, the time from the last unit sold to SOLD_OUT
// at every region and the automatic transfers. QUOTA_WAN=1 runs it (scripts/bench-wan;
// QUOTA_WAN_RUNS as for TestLocalWANCompare).
func TestLocalWANRebalance(t *testing.T) {
	if os.Getenv("QUOTA_WAN") != "1" {
		t.Skip("QUOTA_WAN=1 (scripts/bench-wan) runs the automatic rebalancer's sale at one region with and without --wan")
	}
	runs := wanRunsFromEnv(t)
	figs := map[string]*rebalanceFigures{}
	for _, run := range runs {
		figs[run] = rebalanceRun(t, run)
	}
	rebalanceReport(t, runs, figs)
	for _, run := range runs {
		if f := figs[run]; float64(f.sold) < rebalanceShare*rebalanceUnits {
			t.Errorf("%s: ap sold %d of %d units (%.1f %%), want at least %.1f %% with the rebalancer moving the rest to it; refused %v",
				run, f.sold, rebalanceUnits, 100*float64(f.sold)/rebalanceUnits, 100*rebalanceShare, f.refused)
		}
	}
	lo, wan := figs["loopback"], figs["wan"]
	if lo == nil || wan == nil || lo.sellOut == 0 || wan.sellOut == 0 {
		return
	}
	ratio := wan.sellOut.Seconds() / lo.sellOut.Seconds()
	verdict := "within"
	if ratio > rebalanceRatio {
		verdict = "NOT within"
	}
	t.Logf("sell-out time with --wan / without: %.2f, %s the %.1fx aim (reported, not asserted)", ratio, verdict, rebalanceRatio)
}

// wanRunsFromEnv is the runs QUOTA_WAN_RUNS names (default loopback,wan), each checked.
func wanRunsFromEnv(t *testing.T) []string {
	t.Helper()
	runs := []string{"loopback", "wan"}
	if v := os.Getenv("QUOTA_WAN_RUNS"); v != "" {
		runs = strings.Split(v, ",")
	}
	for _, run := range runs {
		if !slices.Contains([]string{"loopback", "wan", "wan-local-etcd"}, run) {
			t.Fatalf("QUOTA_WAN_RUNS=%s: run %q: want loopback, wan or wan-local-etcd", strings.Join(runs, ","), run)
		}
	}
	return runs
}

// rebalanceRun is one run: a cluster up, the sale, every region's status read from the start,
// ap's buyers until SOLD_OUT, the automatic transfers read from the ledger, the audit, down.
func rebalanceRun(t *testing.T, run string) *rebalanceFigures {
	t.Helper()
	c := wanUp(t, run, "rb"+strconv.Itoa(len(run)))
	const sale = "skew"
	if out, err := c.run(time.Minute, filepath.Join(c.bin, "quotactl"), "--coordinator", c.addr(0), "--timeout", "30s",
		"--certs-dir", c.certsDir(), "sale", "create", "--sale", sale, "--sku", "phone="+strconv.Itoa(rebalanceUnits),
		"--per-user-limit", "1", "--hold-ttl", "10m", "--allocate", "us=40,eu=35,ap=25"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rebalanceLimit+time.Minute)
	defer cancel()
	status := c.watchSoldOut(ctx, t, sale)
	start := time.Now()
	stopPlans := c.tracePlans(ctx, t, run, sale, start)
	events := c.buyAtAp(ctx, sale)
	stopPlans()
	f := rebalanceFiguresOf(start, events)
	seen := status.wait(t, time.Minute)
	if last := start.Add(f.lastSold); f.lastSold > 0 {
		for r, at := range seen {
			f.soldOut[r] = at.Sub(last)
		}
	}
	moves, err := c.autoMoves(ctx, sale, start)
	if err != nil {
		t.Errorf("%s: the automatic transfers: %v", run, err)
	}
	f.moves = moves
	c.auditSale(t, sale)
	c.cluster(2*time.Minute, "down", "--purge")
	c.purged = true
	return f
}

// wanUp brings up a cluster for run (with --wan unless run is loopback; wan-local-etcd gives
// each region process its own region's etcd member only), its databases tagged tag.
func wanUp(t *testing.T, run, tag string) *localCluster {
	t.Helper()
	c := newLocalCluster(t, tag)
	if run == "wan-local-etcd" { // each region process's etcd client to its region's member only
		for _, p := range []struct {
			env    string
			member int
		}{{"REGION_US", 181}, {"REGION_US_2", 181}, {"REGION_EU", 182}, {"REGION_EU_2", 182}, {"REGION_AP", 183}, {"REGION_AP_2", 183}} {
			c.env = append(c.env, "QUOTA_CLUSTER_ETCD_"+p.env+"=https://"+c.addr(p.member))
		}
	}
	args := []string{"up"}
	if run != "loopback" {
		args = append(args, "--wan")
	}
	up := time.Now()
	out := c.cluster(5*time.Minute, args...)
	var raft []string // which member leads raft: it decides what a binding costs each region
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "raft leader") {
			raft = append(raft, strings.Fields(line)[0])
		}
	}
	t.Logf("%s: cluster %s: %s; raft leader %v", run, strings.Join(args, " "), time.Since(up).Round(time.Millisecond), raft)
	return c
}

// buyAtAp sends a new buyer to ap's HTTP edge every rebalancePace, at most rebalanceInFlt
// at once, each reserving one unit and confirming it, until a buyer is told SOLD_OUT or
// rebalanceLimit passes; it returns every buyer's event.
func (c *localCluster) buyAtAp(ctx context.Context, sale string) []buyEvent {
	ctx, cancel := context.WithTimeout(ctx, rebalanceLimit)
	defer cancel()
	hc := c.edgeClient("10.9", 10*time.Second)
	base := "https://" + c.addr(3+httpOffset)
	var (
		mu     sync.Mutex
		events []buyEvent
		wg     sync.WaitGroup
		gone   atomic.Bool
	)
	slots := make(chan struct{}, rebalanceInFlt)
	tick := time.NewTicker(rebalancePace)
	defer tick.Stop()
	for i := 0; !gone.Load(); i++ {
		select {
		case <-ctx.Done():
		case slots <- struct{}{}:
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			e := apBuyer(ctx, hc, base, sale, fmt.Sprintf("ap-buyer-%d", i))
			if e.outcome == "SOLD_OUT" {
				gone.Store(true)
			}
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}()
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	wg.Wait()
	return events
}

// apBuyer is one buyer: reserve one unit, confirm it.
func apBuyer(ctx context.Context, hc *http.Client, base, sale, user string) buyEvent {
	e := buyEvent{sent: time.Now()}
	h, err := edgeDo(ctx, hc, http.MethodPost, base+"/v1/sales/"+sale+"/reservations", map[string]any{"user_id": user,
		"sku": "phone", "quantity": 1, "request_key": "k-" + user})
	switch {
	case err != nil:
		e.outcome = "reserve: " + err.Error()
	case h.code/100 != 2:
		e.outcome = h.errCode()
	default:
		a, err := edgeDo(ctx, hc, http.MethodPost, base+"/v1/holds/"+url.PathEscape(h.str("hold_id"))+"/confirm",
			map[string]string{"payment_id": "pay-" + user})
		switch {
		case err != nil:
			e.outcome = "confirm: " + err.Error()
		case a.code/100 != 2:
			e.outcome = "confirm " + a.errCode()
		case a.str("outcome") != "sold":
			e.outcome = "confirm " + a.str("outcome")
		default:
			e.outcome = "sold"
		}
	}
	e.answered = time.Now()
	return e
}

// rebalanceFiguresOf works a run's figures out of its buyers' events; start is when the
// first buyer was sent.
func rebalanceFiguresOf(start time.Time, events []buyEvent) *rebalanceFigures {
	slices.SortFunc(events, func(a, b buyEvent) int { return a.sent.Compare(b.sent) })
	f := &rebalanceFigures{buyers: len(events), refused: map[string]int{}, soldOut: map[string]time.Duration{}}
	var dryFrom time.Time // the arrival of the first buyer told REGION_EXHAUSTED in the spell; zero: not dry
	spell := 0            // buyers told REGION_EXHAUSTED in it
	for _, e := range events {
		switch e.outcome {
		case "sold":
			f.sold++
			f.lastSold = max(f.lastSold, e.answered.Sub(start))
			if !dryFrom.IsZero() {
				f.dry = append(f.dry, e.sent.Sub(dryFrom))
				dryFrom, spell = time.Time{}, 0
			}
			continue
		case "REGION_EXHAUSTED":
			if dryFrom.IsZero() {
				dryFrom = e.sent
			}
			spell++
		case "SOLD_OUT":
			if at := e.answered.Sub(start); f.sellOut == 0 || at < f.sellOut {
				f.sellOut = at
			}
		}
		f.refused[e.outcome]++
	}
	f.tail = spell
	return f
}

// soldOutWatch reads each region's sale status (gRPC DescribeSale at its leader, which reads
// the coordinator's sold-out flag from the region's memory and counts no demand) every
// rebalanceStatusT until it says the SKU is sold out.
type soldOutWatch struct {
	mu      sync.Mutex
	seen    map[string]time.Time // region → when its first "sold out" answer came
	lastErr map[string]string
	done    chan struct{} // closed once every reader has returned
	cancel  context.CancelFunc
}

// watchSoldOut starts the readers of sale's status at the three regions' leaders.
func (c *localCluster) watchSoldOut(ctx context.Context, t *testing.T, sale string) *soldOutWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	w := &soldOutWatch{seen: map[string]time.Time{}, lastErr: map[string]string{}, done: make(chan struct{}), cancel: cancel}
	var wg sync.WaitGroup
	for _, r := range wanRegions {
		rc := c.regionClient(t, c.addr(r.offset))
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.watch(ctx, rc, r.name, sale)
		}()
	}
	go func() {
		wg.Wait()
		close(w.done)
	}()
	return w
}

// watch reads one region's status until it says sold out or ctx ends.
func (w *soldOutWatch) watch(ctx context.Context, rc quotav1.RegionServiceClient, region, sale string) {
	tick := time.NewTicker(rebalanceStatusT)
	defer tick.Stop()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		d, err := rc.DescribeSale(cctx, &quotav1.DescribeSaleRequest{SaleId: sale})
		ccancel()
		w.mu.Lock()
		if err != nil {
			w.lastErr[region] = err.Error()
		}
		if soldOut := err == nil && len(d.GetSkus()) == 1 && d.GetSkus()[0].GetSoldOut(); soldOut {
			w.seen[region] = time.Now()
		}
		_, seen := w.seen[region]
		w.mu.Unlock()
		if seen {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// wait waits up to within for every region to say sold out, stops the readers and returns
// when each did (a region missing never did).
func (w *soldOutWatch) wait(t *testing.T, within time.Duration) map[string]time.Time {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(within):
	}
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range wanRegions {
		if _, ok := w.seen[r.name]; !ok {
			t.Logf("%s never said sold out within %s of the last buyer (last error: %q)", r.name, within, w.lastErr[r.name])
		}
	}
	return maps.Clone(w.seen)
}

// autoMoves reads the sale's automatic transfers (every one not out of the unallocated pool:
// nobody else moves stock here) from the coordinator's ledger, times from start.
func (c *localCluster) autoMoves(ctx context.Context, sale string, start time.Time) ([]autoMove, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := c.connectDB(ctx, "coordinator")
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT from_pool, to_pool, units, state = 'posted', created_at, updated_at FROM transfers
		WHERE sale_id = $1 AND from_pool <> 'unallocated' ORDER BY created_at`, sale)
	if err != nil {
		return nil, err
	}
	var out []autoMove
	var m autoMove
	var posted bool
	var created, updated time.Time
	_, err = pgx.ForEachRow(rows, []any{&m.from, &m.to, &m.units, &posted, &created, &updated}, func() error {
		m.start, m.posted = created.Sub(start), 0
		if posted {
			m.posted = updated.Sub(created)
		}
		out = append(out, m)
		return nil
	})
	return out, err
}

// rebalanceReport logs the runs' figures side by side.
func rebalanceReport(t *testing.T, runs []string, figs map[string]*rebalanceFigures) {
	t.Helper()
	var b strings.Builder
	row := func(name string, val func(f *rebalanceFigures) string) {
		fmt.Fprintf(&b, "%-46s", name)
		for _, run := range runs {
			fmt.Fprintf(&b, " %-24s", val(figs[run]))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "%-46s", "")
	for _, run := range runs {
		fmt.Fprintf(&b, " %-24s", run)
	}
	b.WriteString("\n")
	row("units sold at ap / total", func(f *rebalanceFigures) string {
		return fmt.Sprintf("%d/%d (%.1f %%)", f.sold, rebalanceUnits, 100*float64(f.sold)/rebalanceUnits)
	})
	row("buyers at ap", func(f *rebalanceFigures) string { return strconv.Itoa(f.buyers) })
	row("  told REGION_EXHAUSTED / SOLD_OUT / other", func(f *rebalanceFigures) string {
		other := f.buyers - f.sold - f.refused["REGION_EXHAUSTED"] - f.refused["SOLD_OUT"]
		return fmt.Sprintf("%d / %d / %d", f.refused["REGION_EXHAUSTED"], f.refused["SOLD_OUT"], other)
	})
	row("sell-out: first buyer to SOLD_OUT at ap (s)", func(f *rebalanceFigures) string { return secs(f.sellOut) })
	row("first buyer to the last unit sold (s)", func(f *rebalanceFigures) string { return secs(f.lastSold) })
	row("ap ran dry and was fed again: spells", func(f *rebalanceFigures) string { return strconv.Itoa(len(f.dry)) })
	row("  dry to the next unit sold p50 / max (ms)", func(f *rebalanceFigures) string {
		if len(f.dry) == 0 {
			return "-"
		}
		return ms(pct(f.dry, 50)) + " / " + ms(pct(f.dry, 100))
	})
	row("  told REGION_EXHAUSTED after the last unit", func(f *rebalanceFigures) string { return strconv.Itoa(f.tail) })
	for _, r := range wanRegions {
		row("last unit sold to SOLD_OUT at "+r.name+" (ms)", func(f *rebalanceFigures) string {
			if d, ok := f.soldOut[r.name]; ok {
				return ms(d)
			}
			return "never"
		})
	}
	row("automatic moves (units)", func(f *rebalanceFigures) string {
		units := 0
		for _, m := range f.moves {
			units += m.units
		}
		return fmt.Sprintf("%d (%d)", len(f.moves), units)
	})
	row("  first started after the first buyer (ms)", firstMove)
	row("  recorded to posted p50 / max (ms)", movesPosted)
	t.Logf("the automatic rebalancer, %d units allocated 40/35/25 over us/eu/ap, every buyer at ap (one every %s, at most %d at once):\n%s",
		rebalanceUnits, rebalancePace, rebalanceInFlt, b.String())
	logMoves(t, runs, figs)
}

// logMoves logs each run's answers other than a unit sold and its automatic transfers.
func logMoves(t *testing.T, runs []string, figs map[string]*rebalanceFigures) {
	t.Helper()
	for _, run := range runs {
		t.Logf("%s: answers other than a unit sold: %v", run, figs[run].refused)
		for _, m := range figs[run].moves {
			t.Logf("%s: move %d %s → %s at %s ms, posted after %s ms", run, m.units, m.from, m.to, ms(m.start), ms(m.posted))
		}
	}
}

// firstMove is when the first automatic transfer was recorded, from the first buyer.
func firstMove(f *rebalanceFigures) string {
	if len(f.moves) == 0 {
		return "-"
	}
	return ms(f.moves[0].start)
}

// movesPosted is the p50 and the most of the automatic transfers' times to posted.
func movesPosted(f *rebalanceFigures) string {
	if len(f.moves) == 0 {
		return "-"
	}
	var ds []time.Duration
	for _, m := range f.moves {
		ds = append(ds, m.posted)
	}
	return ms(pct(ds, 50)) + " / " + ms(pct(ds, 100))
}

// secs is d in seconds with two decimals, "-" for 0 (it did not happen).
func secs(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
}

// tracePlans, with QUOTA_WAN_PLANS=1, asks the leading coordinator for its automatic
// rebalancer's next step (PlanRebalance, as `quotactl rebalance --plan`) every 250 ms until
// ctx ends, and logs each answer in a line: time from start, near sell-out, transfers in
// flight, per pool available+incoming/recent→need, the moves and what holds them back. The
// returned function stops it and waits for it.
func (c *localCluster) tracePlans(ctx context.Context, t *testing.T, run, sale string, start time.Time) (stop func()) {
	t.Helper()
	if os.Getenv("QUOTA_WAN_PLANS") != "1" {
		return func() {}
	}
	conn, err := grpc.NewClient(c.addr(0), grpc.WithTransportCredentials(c.creds(trust.Operator)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cc := quotav1.NewCoordinatorServiceClient(conn)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			p, err := cc.PlanRebalance(cctx, &quotav1.PlanRebalanceRequest{SaleId: sale})
			ccancel()
			t.Logf("%s plan %s", run, planLine(time.Since(start), p, err))
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
		if err := conn.Close(); err != nil {
			t.Logf("closing the coordinator client: %v", err)
		}
	}
}

// planLine is one PlanRebalance answer in a line.
func planLine(at time.Duration, p *quotav1.PlanRebalanceResponse, err error) string {
	if err != nil {
		return fmt.Sprintf("%7s: %v", secs(at), err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%7s:", secs(at))
	for _, sp := range p.GetSkus() {
		fmt.Fprintf(&b, " near %v, in flight %d;", sp.GetNearSellOut(), sp.GetInFlight())
		for _, pp := range sp.GetPools() {
			fmt.Fprintf(&b, " %s %d+%d/%d→%d", pp.GetPool(), pp.GetAvailable(), pp.GetIncoming(), pp.GetRecent(), pp.GetNeed())
		}
		for _, m := range sp.GetMoves() {
			fmt.Fprintf(&b, "; move %d %s→%s", m.GetUnits(), m.GetFrom(), m.GetTo())
		}
		if sp.GetHeld() != "" {
			fmt.Fprintf(&b, "; held: %s", sp.GetHeld())
		}
	}
	return b.String()
}
