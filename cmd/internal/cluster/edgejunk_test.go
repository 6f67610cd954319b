package cluster_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/region/regionedge"
)

// TestMadeUpSalesTakeNoLineAtAnEdge: polls of MaxLines sale ids that do not exist (each
// answered 404 by the leader) do not make the edge watch them, so a real sale's polls are
// still answered at the edge afterwards, not forwarded to the leader.
func TestMadeUpSalesTakeNoLineAtAnEdge(t *testing.T) {
	const sale = "edgejunk"
	ec := newEdgeCluster(t, sale, 1000, 1, 1000)
	e := ec.edge()
	c := httpClient(t, trust.Storefront)
	base := "https://" + e.Addr()
	for i := range regionedge.MaxLines {
		g := call(t, c, "GET", base+"/v1/sales/junk-"+itoa(i)+"/admissions/0123456789abcdef0123456789abcdef", nil)
		if g.code != http.StatusNotFound {
			t.Fatalf("poll of junk sale %d: %d %v", i, g.code, g.body)
		}
	}
	ids := enterAll(t, c, base, sale, []string{"alice", "bob", "carol", "dave"})
	a0, f0 := e.Edge.Polls()
	for range 20 {
		time.Sleep(100 * time.Millisecond)
		for _, id := range ids {
			if g := call(t, c, "GET", base+"/v1/sales/"+sale+"/admissions/"+id, nil); g.code >= 300 && g.code != http.StatusAccepted {
				t.Fatalf("poll: %d %v", g.code, g.body)
			}
		}
	}
	a1, f1 := e.Edge.Polls()
	t.Logf("after %d junk sale ids: the edge answered %d polls of the real sale, forwarded %d", regionedge.MaxLines, a1-a0, f1-f0)
	if a1 == a0 {
		t.Errorf("the edge answered none of the real sale's %d polls: the junk sale ids took every line it may watch", f1-f0)
	}
}

// TestEdgeDropsALineTheLeaderLost: buyers queue through an edge, which answers their polls
// from its copy of the sale's line. Then the region's new leader knows no such sale (the
// standby that takes over runs on a database of its own): its LineChanges answer NOT_FOUND,
// so the edge drops the line within a few refreshes and forwards the polls, which the leader
// answers 404, rather than answering them from its copy for --max-stale (30 s).
func TestEdgeDropsALineTheLeaderLost(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	const sale = "edgelost"
	ec := newEdgeClusterOn(t, sale, 1000, 1, 1000, true)
	e := ec.edge()
	c := httpClient(t, trust.Storefront)
	base := "https://" + e.Addr()
	ids := enterAll(t, c, base, sale, []string{"alice", "bob", "carol", "dave"})
	poll := func() answer { return call(t, c, "GET", base+"/v1/sales/"+sale+"/admissions/"+ids[3], nil) }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		a0, _ := e.Edge.Polls()
		if g := poll(); g.code != http.StatusAccepted {
			t.Fatalf("dave's poll before the failover: %d %v", g.code, g.body)
		}
		if a1, _ := e.Edge.Polls(); a1 > a0 {
			break // answered from the edge's copy
		}
		if time.Now().After(deadline) {
			t.Fatal("the edge never answered a poll from its copy")
		}
	}
	ec.a.Crash()
	for deadline := time.Now().Add(30 * time.Second); !ec.b.R.Leading(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the standby never led")
		}
	}
	led := time.Now()
	for {
		g := poll()
		if g.code == http.StatusNotFound && g.errCode() == "NOT_FOUND" {
			break
		}
		if g.code != http.StatusAccepted && g.code != http.StatusServiceUnavailable {
			t.Fatalf("dave's poll after the failover: %d %v", g.code, g.body)
		}
		if time.Since(led) > 5*time.Second {
			t.Fatalf("5 s after the new leader lost the sale, the edge still answers %d %v", g.code, g.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the edge dropped the lost line %s after the new leader led", time.Since(led).Round(time.Millisecond))
	_, f0 := e.Edge.Polls()
	if g := poll(); g.code != http.StatusNotFound {
		t.Errorf("dave's next poll: %d %v", g.code, g.body)
	}
	if _, f1 := e.Edge.Polls(); f1 != f0+1 {
		t.Errorf("the poll of the lost sale was not forwarded to the leader (forwarded %d -> %d)", f0, f1)
	}
}
