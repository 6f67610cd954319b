package local_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// The steps the failover, split-brain, database and upgrade scenarios share: a storefront
// load in the background, every acknowledged hold looked up at the leaders afterwards, and the
// audit.

// auditOut is `quotactl audit -o json`.
type auditOut struct {
	OK         bool              `json:"ok"`
	SKUs       []auditSKU        `json:"skus"`
	Violations []json.RawMessage `json:"violations"`
}

// auditSKU is one SKU's line of `quotactl audit -o json`.
type auditSKU struct {
	Sale        string `json:"sale"`
	SKU         string `json:"sku"`
	OK          bool   `json:"ok"`
	Total       int64  `json:"total"`
	Unallocated int64  `json:"unallocated"`
	Available   int64  `json:"available"`
	Held        int64  `json:"held"`
	Sold        int64  `json:"sold"`
	InFlight    int64  `json:"in_flight"`
}

// conserved says whether I1 adds up: every unit of the total is in exactly one place.
func (s auditSKU) conserved() bool {
	return s.Unallocated+s.Available+s.Held+s.Sold+s.InFlight == s.Total
}

// auditSale runs `quotactl audit --sale sale` at the coordinator and wants it clean, with one
// SKU whose units are conserved; it returns that SKU's line.
func (c *localCluster) auditSale(t *testing.T, sale string) auditSKU {
	t.Helper()
	out, err := c.quotactl(c.addr(0), "audit", "--sale", sale, "-o", "json")
	var a auditOut
	if jerr := json.Unmarshal([]byte(out), &a); jerr != nil || len(a.SKUs) != 1 {
		t.Fatalf("quotactl audit --sale %s: %v (%v)\n%s", sale, err, jerr, out)
	}
	s := a.SKUs[0]
	t.Logf("audit %s: ok %v; total %d = unallocated %d + available %d + held %d + sold %d + in flight %d",
		sale, a.OK, s.Total, s.Unallocated, s.Available, s.Held, s.Sold, s.InFlight)
	if err != nil || !a.OK || !s.OK || len(a.Violations) != 0 || !s.conserved() {
		t.Errorf("audit not clean or units not conserved (%v):\n%s", err, out)
	}
	return s
}

// backgroundLoad is a loadgen run in a goroutine the test owns.
type backgroundLoad struct {
	done   chan struct{}
	cancel context.CancelFunc
	st     loadgen.Stats
	err    error
}

// startLoad runs cfg against the cluster in the background. Its Resolve, when cfg has none,
// asks the coordinator where a region answers now. On every way out of the test (t.Fatal
// included) the load is cancelled and waited for before the cluster goes down.
func (c *localCluster) startLoad(ctx context.Context, cfg loadgen.Config) *backgroundLoad {
	if cfg.Creds == nil {
		cfg.Creds = c.creds(trust.Storefront)
	}
	if cfg.Resolve == nil {
		opCreds, coord := c.creds(trust.Operator), c.addr(0)
		cfg.Resolve = func(ctx context.Context, region string) string { return currentRegionAddr(ctx, opCreds, coord, region) }
	}
	if cfg.Progress == nil && cfg.ProgressEvery > 0 {
		t := c.t
		cfg.Progress = func(s loadgen.Stats) {
			t.Logf("load %5.1fs: %d buyers, %d holds, %d confirmed, %d failed, %d retries",
				s.Elapsed.Seconds(), s.Buyers, s.Granted, s.Confirmed, s.Failed, s.Retries)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &backgroundLoad{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(l.done)
		l.st, l.err = loadgen.Run(ctx, cfg)
	}()
	c.t.Cleanup(func() { cancel(); <-l.done })
	return l
}

// running fails the test when the load has already ended (it was meant to outlast the wait).
func (l *backgroundLoad) running(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-l.done:
		t.Fatalf("the load ended before the fault: %+v %v", l.st, l.err)
	case <-time.After(d):
	}
}

// wait returns the load's figures once it ends by itself (within limit), failing the test on
// its error.
func (l *backgroundLoad) wait(t *testing.T, limit time.Duration) loadgen.Stats {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(limit):
		t.Fatalf("the load did not end within %s", limit)
	}
	if l.err != nil {
		t.Fatal(l.err)
	}
	t.Logf("load: %d buyers, %d holds acknowledged, %d confirmed, %d refunded, %d failed, %d exhausted, %d retries in %s",
		l.st.Buyers, len(l.st.Holds), l.st.Confirmed, l.st.Refunded, l.st.Failed, l.st.Exhausted, l.st.Retries, l.st.Elapsed.Round(time.Millisecond))
	if len(l.st.Holds) == 0 {
		t.Fatal("the load acknowledged no hold")
	}
	return l.st
}

// stop cancels the load and returns its figures (a cancelled run's error is not a failure).
func (l *backgroundLoad) stop(t *testing.T) loadgen.Stats {
	t.Helper()
	l.cancel()
	<-l.done
	if l.err != nil && !strings.Contains(l.err.Error(), context.Canceled.Error()) {
		t.Fatal(l.err)
	}
	t.Logf("load: %d holds acknowledged, %d confirmed, %d failed, %d retries in %s",
		len(l.st.Holds), l.st.Confirmed, l.st.Failed, l.st.Retries, l.st.Elapsed.Round(time.Second))
	if len(l.st.Holds) == 0 {
		t.Fatal("the load acknowledged no hold")
	}
	return l.st
}

// holdTally counts acknowledged holds as a leader reports them: held, sold, or lost (missing,
// or in another state), with each found hold's expiry.
type holdTally struct {
	held, sold int
	lost       []string
	expires    map[string]time.Time
}

func (h *holdTally) add(id string, res *quotav1.GetReservationResponse, err error) {
	switch s := res.GetReservation().GetState(); {
	case err != nil:
		h.lost = append(h.lost, id+": "+err.Error())
		return
	case s == quotav1.HoldState_HOLD_STATE_HELD:
		h.held++
	case s == quotav1.HoldState_HOLD_STATE_SOLD:
		h.sold++
	default:
		h.lost = append(h.lost, id+": state "+s.String())
		return
	}
	if h.expires == nil {
		h.expires = map[string]time.Time{}
	}
	h.expires[id] = res.GetReservation().GetExpiresAt().AsTime()
}

// check fails the test on any lost hold, or fewer sold than the confirms acknowledged.
func (h *holdTally) check(t *testing.T, confirmed int64) {
	t.Helper()
	t.Logf("acknowledged holds at the leaders: %d held, %d sold, %d lost", h.held, h.sold, len(h.lost))
	if len(h.lost) > 0 {
		t.Errorf("acknowledged holds missing or not held/sold at the leaders, for instance:\n%s",
			strings.Join(h.lost[:min(len(h.lost), 10)], "\n"))
	}
	if int64(h.sold) < confirmed {
		t.Errorf("%d of the acknowledged holds are sold, but %d confirms were acknowledged", h.sold, confirmed)
	}
}

// lookupHolds asks each hold's region leader (found through the coordinator) for every hold
// in holds (hold id → region), sixteen at a time, and tallies the answers.
func (c *localCluster) lookupHolds(holds map[string]string) *holdTally {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opCreds, sfCreds := c.creds(trust.Operator), c.creds(trust.Storefront)
	clients := map[string]quotav1.RegionServiceClient{}
	for _, region := range holds {
		if clients[region] != nil {
			continue
		}
		conn, err := grpc.NewClient(currentRegionAddr(ctx, opCreds, c.addr(0), region), grpc.WithTransportCredentials(sfCreds))
		if err != nil {
			c.t.Fatal(err)
		}
		defer conn.Close()
		clients[region] = quotav1.NewRegionServiceClient(conn)
	}
	var (
		mu    sync.Mutex
		tally holdTally
		wg    sync.WaitGroup
		ids   = make(chan string)
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := clients[holds[id]].GetReservation(cctx, &quotav1.GetReservationRequest{HoldId: id})
				ccancel()
				mu.Lock()
				tally.add(id, res, err)
				mu.Unlock()
			}
		}()
	}
	for id := range holds {
		ids <- id
	}
	close(ids)
	wg.Wait()
	return &tally
}
