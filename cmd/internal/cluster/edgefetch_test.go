package cluster_test

import (
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/trust"
)

// sameAsLeader reports whether edge n answers every admission of ids from its copy of
// sale's line as the leader (ec.a) answers it: state, position, expiry. The reason names the
// first difference.
func sameAsLeader(ec *edgeCluster, n *cluster.EdgeNode, sale string, ids []string) (bool, string) {
	for _, id := range ids {
		before, _ := n.Edge.Polls()
		at, err := n.Edge.GetAdmission(ec.ctx, sale, id)
		if err != nil {
			return false, id + " at the edge: " + err.Error()
		}
		if answered, _ := n.Edge.Polls(); answered == before {
			return false, id + ": forwarded, not in the edge's copy"
		}
		want, err := ec.a.Door.GetAdmission(ec.ctx, sale, id)
		if err != nil {
			return false, id + " at the leader: " + err.Error()
		}
		if at.State != want.State || at.Position != want.Position || !at.ExpiresAt.Equal(want.ExpiresAt) {
			return false, id + ": edge " + string(at.State) + " at " + itoa(at.Position) + ", leader " + string(want.State) + " at " + itoa(want.Position)
		}
	}
	return true, ""
}

// waitSame waits (10 s at most) until the edge's copy answers every admission of ids as the
// leader does.
func waitSame(t *testing.T, ec *edgeCluster, n *cluster.EdgeNode, sale string, ids []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, why := sameAsLeader(ec, n, sale, ids)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the edge's copy still differs from the leader's line after 10 s: %s", why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEdgeFetchesFollowTheLine: an edge (refresh 100 ms) keeps a sale's line whose three
// live tickets are taken and five buyers queue behind them, so the line stands still. Its
// copy answers every buyer as the leader does; while the line stands still the leader holds
// the edge's fetches (a long poll), so the edge gets at most a few answers in 3 s instead of
// one per refresh (30); and a buyer who enters at the leader is in the edge's copy, at the
// leader's position, within a second.
func TestEdgeFetchesFollowTheLine(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	const sale = "edgefetch"
	ec := newEdgeCluster(t, sale, 1000, 10, 3)
	n := ec.edge()
	users := make([]string, 8)
	for i := range users {
		users[i] = "buyer-" + itoa(i)
	}
	ids := enterAll(t, httpClient(t, trust.Storefront), "https://"+n.Addr(), sale, users)
	waitSame(t, ec, n, sale, ids)
	time.Sleep(500 * time.Millisecond) // the admitted buyers' bindings are written
	waitSame(t, ec, n, sale, ids)
	f0 := n.Edge.Fetches()
	time.Sleep(3 * time.Second)
	fetched := n.Edge.Fetches() - f0
	t.Logf("the edge got %d answers to its fetches in 3 s of a line standing still (refresh 100 ms)", fetched)
	if fetched > 4 {
		t.Errorf("the edge got %d answers in 3 s of a line standing still; want at most 4 (held until the line changes)", fetched)
	}
	if ok, why := sameAsLeader(ec, n, sale, ids); !ok {
		t.Fatalf("after 3 s: %s", why)
	}
	entered := time.Now()
	late, err := ec.a.Door.Enter(ec.ctx, sale, "late", "")
	if err != nil {
		t.Fatal(err)
	}
	waitSame(t, ec, n, sale, append(ids, late.ID))
	took := time.Since(entered)
	t.Logf("a buyer entered at the leader was in the edge's copy %s later (position %d)", took.Round(time.Millisecond), late.Position)
	if took > time.Second || late.Position != 6 {
		t.Errorf("a buyer entered at the leader (position %d, want 6) reached the edge's copy %s later; want within a second", late.Position, took)
	}
}
