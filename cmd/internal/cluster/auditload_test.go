package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// coordinators tracks the running coordinators and finds the leader for a request.
type coordinators struct {
	mu      sync.Mutex
	tc      *testCluster
	nodes   []*cluster.CoordinatorNode
	clients map[string]quotav1.CoordinatorServiceClient // by address: one connection each
}

// client is the operator's client of n, dialed once: a connection per call would hold
// hundreds open from one address, past the servers' bound per address.
func (cs *coordinators) client(n *cluster.CoordinatorNode) quotav1.CoordinatorServiceClient {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.clients == nil {
		cs.clients = map[string]quotav1.CoordinatorServiceClient{}
	}
	c, ok := cs.clients[n.Addr()]
	if !ok {
		c = quotav1.NewCoordinatorServiceClient(dial(cs.tc.t, n.Addr(), trust.Operator))
		cs.clients[n.Addr()] = c
	}
	return c
}

func (cs *coordinators) list() []*cluster.CoordinatorNode {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return append([]*cluster.CoordinatorNode(nil), cs.nodes...)
}

// crashLeader kills the leading coordinator (its lease left to expire) and starts a new
// standby, so two coordinators run again.
func (cs *coordinators) crashLeader(t *testing.T) {
	for _, n := range cs.list() {
		if _, err := n.C.Generation(); err == nil {
			n.Crash()
			cs.mu.Lock()
			for i, m := range cs.nodes {
				if m == n {
					cs.nodes = append(cs.nodes[:i], cs.nodes[i+1:]...)
					break
				}
			}
			cs.mu.Unlock()
			break
		}
	}
	n := cs.tc.addCoordinator(2 * time.Second)
	cs.mu.Lock()
	cs.nodes = append(cs.nodes, n)
	cs.mu.Unlock()
}

// transfer sends one transfer to whichever coordinator leads, retrying the same request id
// (so it is never applied twice) until one answers.
func (cs *coordinators) transfer(ctx context.Context, req *quotav1.TransferRequest) (*quotav1.TransferResponse, error) {
	var last error
	for attempt := 0; attempt < 200 && ctx.Err() == nil; attempt++ {
		for _, n := range cs.list() {
			r, err := cs.client(n).Transfer(ctx, req)
			if err == nil || (apierr.Reason(err) != "NOT_LEADER" && apierr.Reason(err) != "FENCED" && apierr.Reason(err) != "UNKNOWN_OUTCOME" && apierr.Reason(err) != "") {
				return r, err
			}
			last = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, last
}

// TestAuditUnderLoad: three regions sell at full speed while 200 random transfers run
// between them and the coordinator leader is killed twice. An audit every second never
// reports a violation, and the final audit is exact.
func TestAuditUnderLoad(t *testing.T) {
	tc := newTestCluster(t, "us", "eu", "ap")
	first := leader(t, tc)
	cs := &coordinators{tc: tc, nodes: append([]*cluster.CoordinatorNode(nil), tc.coords...)}
	cs.nodes = append(cs.nodes, tc.addCoordinator(2*time.Second))
	createSale(t, first, "busy", 20000, 2, 10*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var regions []loadgen.Region
	for _, name := range []string{"us", "eu", "ap"} {
		regions = append(regions, loadgen.Region{Name: name, Addr: tc.regions[name].Addr(), Weight: 1})
	}
	var wg sync.WaitGroup
	var sold loadgen.Stats
	wg.Add(1)
	go func() {
		defer wg.Done()
		st, err := loadgen.Run(ctx, loadgen.Config{Creds: creds(t, trust.Storefront), Sale: "busy", SKU: "phone", Regions: regions, Buyers: 25000, Concurrency: 200,
			ConfirmRatio: 0.7, ReleaseRatio: 0.1, MaxDuration: 3 * time.Minute, Seed: 11})
		if err != nil {
			t.Error(err)
		}
		sold = st
	}()

	stopAudits := make(chan struct{})
	var audits, violations atomic.Int64
	var auditor sync.WaitGroup
	auditor.Add(1)
	go func() {
		defer auditor.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopAudits:
				return
			case <-tick.C:
			}
			for _, n := range cs.list() {
				rep, err := n.C.Audit(ctx, "busy")
				if err != nil {
					continue // this coordinator is crashing; the next one audits
				}
				audits.Add(1)
				if !rep.OK {
					violations.Add(1)
					t.Errorf("audit under load reported violations: %+v", rep.Violations)
				}
				break
			}
		}
	}()

	rng := rand.New(rand.NewPCG(5, 5))
	names := []string{"us", "eu", "ap"}
	outcomes := map[string]int{}
	for i := 0; i < 200; i++ {
		if i == 60 || i == 130 {
			cs.crashLeader(t)
		}
		from := names[rng.IntN(3)]
		to := names[(indexOf(names, from)+1+rng.IntN(2))%3]
		r, err := cs.transfer(ctx, &quotav1.TransferRequest{SaleId: "busy", Sku: "phone", From: from, To: to,
			Units: int64(1 + rng.IntN(40)), RequestId: fmt.Sprintf("load-%d", i)})
		switch {
		case err == nil:
			outcomes[r.GetTransfer().GetState()]++
		case apierr.Reason(err) == "INVALID_ARGUMENT": // the source had sold too much already
			outcomes["refused"]++
		default:
			t.Fatalf("transfer %d: %v", i, err)
		}
	}
	wg.Wait() // the load is bounded
	close(stopAudits)
	auditor.Wait()
	t.Logf("transfers: %v; buyers %d granted %d; %d audits during the run", outcomes, sold.Buyers, sold.Granted, audits.Load())
	if audits.Load() < 3 {
		t.Fatalf("only %d audits ran during the load", audits.Load())
	}
	// Let the leader finish what the crashes left unfinished, then the audit must be exact.
	waitFor(t, "every transfer to finish", 60*time.Second, func() bool {
		for _, n := range cs.list() {
			ts, err := n.C.Transfers(ctx, "busy")
			if err != nil {
				continue
			}
			for _, tr := range ts {
				if !tr.State.Final() {
					return false
				}
			}
			return true
		}
		return false
	})
	for _, n := range cs.list() {
		rep, err := n.C.Audit(ctx, "busy")
		if err != nil {
			continue
		}
		a := rep.SKUs[0]
		if !rep.OK || a.InFlight != 0 || a.Total != a.Unallocated+a.Available+a.Held+a.Sold {
			t.Fatalf("final audit %+v, violations %+v", a, rep.Violations)
		}
		return
	}
	t.Fatal("no coordinator could audit at the end")
}

func indexOf(xs []string, x string) int {
	for i, s := range xs {
		if s == x {
			return i
		}
	}
	return -1
}
