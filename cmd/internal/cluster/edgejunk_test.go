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
