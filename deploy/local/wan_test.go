package local_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/wanlink"
)

// The ports of `cluster up --wan`'s delay links (cluster-wan.sh): the etcd members' own peer
// ports behind their links, the etcd client links, the us>R links to region processes and to
// the regions' databases.
func init() {
	portOffsets = append(portOffsets, 401, 402, 403, 410, 411, 412, 413, 414, 415, 416, 417, 418,
		422, 423, 432, 433, 441, 442, 443)
}

// wanRegions are the regions with their primaries' port offsets (their HTTP edges are at
// offset + httpOffset).
var wanRegions = []struct {
	name   string
	offset int
}{{"us", 1}, {"eu", 2}, {"ap", 3}}

// regionFigures are one region's buyers' times at its HTTP edge: entering the waiting room to
// holding a ticket (admission, with the buyer's binding), and the reservation with the ticket.
type regionFigures struct {
	admit, reserve []time.Duration
	held           int
	refused        map[string]int // an admission or reservation's error code or state → buyers
}

// pct is the p-th percentile of ds (sorted in place); 0 without figures.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, len(ds)*p/100)]
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) }

// wanSale is one bounded flash sale through the regions' primaries' HTTP edges: perRegion
// buyers at each region, conc at a time per region, each entering the sale's waiting room,
// polling its admission every 20 ms until it holds a ticket, then reserving one unit with it.
// It returns each region's figures; the whole sale is bounded by limit.
func (c *localCluster) wanSale(ctx context.Context, sale string, perRegion, conc int, limit time.Duration) map[string]*regionFigures {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	hc := c.edgeClient("10.7", 10*time.Second)
	out := map[string]*regionFigures{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range wanRegions {
		f := &regionFigures{refused: map[string]int{}}
		out[r.name] = f
		base := "https://" + c.addr(r.offset+httpOffset) + "/v1/sales/" + sale
		next := make(chan int)
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					admit, reserve, why := wanBuyer(ctx, hc, base, fmt.Sprintf("%s-buyer-%d", r.name, i))
					mu.Lock()
					if why != "" {
						f.refused[why]++
					} else {
						f.held++
						f.admit, f.reserve = append(f.admit, admit), append(f.reserve, reserve)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(next)
			for i := range perRegion {
				select {
				case next <- i:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// wanBuyer is one ticketed buyer: enter, poll until admitted, reserve with the ticket. It
// returns the admission's and the reservation's times, or why the buyer holds nothing.
func wanBuyer(ctx context.Context, hc *http.Client, base, user string) (admit, reserve time.Duration, why string) {
	start := time.Now()
	a, err := edgeDo(ctx, hc, http.MethodPost, base+"/admissions", map[string]string{"user_id": user})
	for err == nil && a.code/100 == 2 && a.str("state") != "admitted" {
		if st := a.str("state"); st != "queued" && st != "binding" {
			return 0, 0, "admission " + st
		}
		select {
		case <-ctx.Done():
			return 0, 0, "admission: " + ctx.Err().Error()
		case <-time.After(20 * time.Millisecond):
		}
		a, err = edgeDo(ctx, hc, http.MethodGet, base+"/admissions/"+a.str("admission_id"), nil)
	}
	switch {
	case err != nil:
		return 0, 0, "admission: " + err.Error()
	case a.code/100 != 2:
		return 0, 0, "admission " + a.errCode()
	}
	admit = time.Since(start)
	start = time.Now()
	h, err := edgeDo(ctx, hc, http.MethodPost, base+"/reservations", map[string]any{"ticket": a.str("ticket"),
		"sku": "phone", "quantity": 1, "request_key": "k-" + user})
	switch {
	case err != nil:
		return 0, 0, "reserve: " + err.Error()
	case h.code/100 != 2:
		return 0, 0, "reserve " + h.errCode()
	}
	return admit, time.Since(start), ""
}

// wanReport logs a table of the figures of each run (by its name), side by side per region.
func wanReport(t *testing.T, runs []string, figs map[string]map[string]*regionFigures) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%-4s %-8s %6s %10s %10s %10s %10s  %s\n", "", "run", "held", "reserve50", "reserve99", "admit50", "admit99", "refused")
	for _, r := range wanRegions {
		for _, run := range runs {
			f := figs[run][r.name]
			fmt.Fprintf(&b, "%-4s %-8s %6d %10s %10s %10s %10s  %v\n", r.name, run, f.held, ms(pct(f.reserve, 50)), ms(pct(f.reserve, 99)),
				ms(pct(f.admit, 50)), ms(pct(f.admit, 99)), f.refused)
		}
	}
	t.Logf("figures at the regions' HTTP edges (ms):\n%s", b.String())
}

// createWanSale creates a sale with a waiting room and stock units, a third at each region.
func (c *localCluster) createWanSale(t *testing.T, sale string, stock int) {
	t.Helper()
	if out, err := c.quotactl(c.addr(0), "sale", "create", "--sale", sale, "--sku", "phone="+strconv.Itoa(stock),
		"--per-user-limit", "2", "--hold-ttl", "10m", "--admit-rate", "1000", "--ticket-ttl", "2m",
		"--allocate", "us=1,eu=1,ap=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
}

// wanSmokeReserveP50 is the most a ticketed reservation's p50 may take at any region's edge
// with --wan: a round trip across the ocean on its path (80 ms at the least, less 6 ms of
// jitter) takes it over, while loopback on a loaded machine stays well under.
const wanSmokeReserveP50 = 60 * time.Millisecond

// TestLocalWANSmoke brings a cluster up with --wan (default delays, no standbys) and runs a
// small ticketed flash sale through the three regions' HTTP edges: at every region a
// reservation with its ticket stays local, its p50 under wanSmokeReserveP50, so a round trip
// across the ocean added to a buyer's reservation fails it. QUOTA_WAN_PATH_DELAY=40ms puts
// such a trip there on purpose (region-us's database through a delay link), to see it fail.
func TestLocalWANSmoke(t *testing.T) {
	started := time.Now()
	env := []string{"QUOTA_CLUSTER_STANDBYS=0"}
	if d := os.Getenv("QUOTA_WAN_PATH_DELAY"); d != "" {
		env = append(env, "QUOTA_CLUSTER_PG_ADDR_REGION_US="+pathDelay(t, d))
	}
	c := newLocalCluster(t, "wan", env...)
	out := c.cluster(4*time.Minute, "up", "--wan")
	t.Logf("cluster up --wan: %s\n%s", time.Since(started).Round(time.Millisecond), out)
	c.createWanSale(t, "smoke", 600)
	figs := c.wanSale(context.Background(), "smoke", 40, 4, time.Minute)
	wanReport(t, []string{"wan"}, map[string]map[string]*regionFigures{"wan": figs})
	for _, r := range wanRegions {
		f := figs[r.name]
		if f.held < 30 {
			t.Errorf("%s: %d of 40 buyers hold a unit (refused %v), want at least 30", r.name, f.held, f.refused)
			continue
		}
		if p := pct(f.reserve, 50); p > wanSmokeReserveP50 {
			t.Errorf("%s: a ticketed reservation's p50 is %s ms at its edge with --wan, want at most %s: a round trip across the ocean on the buyer's path?",
				r.name, ms(p), wanSmokeReserveP50)
		}
	}
	c.auditSale(t, "smoke")
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}

// pathDelay starts a delay link of one-way delay d to the test's PostgreSQL server, closed when
// the test ends, and returns its address.
func pathDelay(t *testing.T, d string) string {
	t.Helper()
	delay, err := time.ParseDuration(d)
	if err != nil {
		t.Fatalf("QUOTA_WAN_PATH_DELAY=%s: %v", d, err)
	}
	pg, err := url.Parse(testpg.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	l, err := wanlink.Listen(wanlink.Route{Name: "path", Listen: "127.0.0.1:0", Upstream: pg.Host, Delay: delay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	t.Logf("region-us's database through a %s delay link at %s", delay, l.Addr())
	return l.Addr()
}
