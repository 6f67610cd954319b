package cluster_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/netfault"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"google.golang.org/grpc"
)

// testCluster is regions and coordinators started one by one, each region behind a proxy on
// the coordinators' side so a test can cut the coordinator off from a region.
type testCluster struct {
	t       *testing.T
	etcd    *fencing.Client
	regions map[string]*cluster.RegionNode
	proxies map[string]*netfault.Proxy
	eps     []cluster.RegionEndpoint
	ledger  string
	coords  []*cluster.CoordinatorNode
	// rawGen is the highest generation a raw coordinator (rawCoordinator) leads with: those
	// lead without an election, so the regions count them as elected leaders' generations.
	rawGen atomic.Int64
	// conns are the test's connections, one per address and role (connOf): a connection per
	// call would hold hundreds open from one address, past the servers' bound per address.
	conns sync.Map
}

// connOf is the test's one connection to addr as role.
func (tc *testCluster) connOf(addr string, role trust.Role) *grpc.ClientConn {
	key := addr + "|" + string(role)
	if c, ok := tc.conns.Load(key); ok {
		return c.(*grpc.ClientConn)
	}
	c, _ := tc.conns.LoadOrStore(key, dial(tc.t, addr, role))
	return c.(*grpc.ClientConn)
}

// coordinatorGeneration is the regions' bound on generations: the etcd leader's, or a raw
// coordinator's when higher.
func (tc *testCluster) coordinatorGeneration(ctx context.Context) (int64, error) {
	_, gen, err := fencing.Leader(ctx, tc.etcd, "coordinator")
	if raw := tc.rawGen.Load(); raw > gen {
		return raw, nil
	}
	return gen, err
}

// newTestCluster starts an embedded etcd and the named regions, each on its own database and
// behind a proxy; coordinators are added with addCoordinator.
//
// Every test's cluster is its own (etcd, databases, ports), so the long tests that assert
// outcomes only (no oversell, every acknowledged hold kept, the audit exact) and spend their
// time waiting (for leases to expire, takeovers, restarts) call t.Parallel: two at a time
// take about half the wall time. Tests that assert a time bound (the kill switch's second,
// the sold-out flags' "at once") stay serial, and so do the loads at full speed (the flash
// sale, the shoppers, the audit under load), which would only slow each other.
func newTestCluster(t *testing.T, names ...string) *testCluster {
	t.Helper()
	e, err := fencing.StartEmbedded(t.TempDir(), testnet.URL(t), testnet.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	etcd, err := fencing.Dial([]string{e.ClientURL}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	tc := &testCluster{t: t, etcd: etcd, regions: map[string]*cluster.RegionNode{}, proxies: map[string]*netfault.Proxy{},
		ledger: testpg.NewDB(t, "ledger")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range names {
		db := testpg.NewDB(t, "region_"+name)
		n, err := cluster.StartRegion(ctx, cluster.RegionConfig{Region: region.Config{Name: name, Verify: verify(),
			Cluster: region.ClusterView{CoordinatorGeneration: tc.coordinatorGeneration}}, Listen: "127.0.0.1:0", DBURL: db,
			LeaseTTL: 2 * time.Second, TLS: certs, Logger: testLogger()}, etcd)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		if err := n.WaitLeading(ctx); err != nil {
			t.Fatal(err)
		}
		p, err := netfault.Listen(n.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		tc.regions[name], tc.proxies[name] = n, p
		tc.eps = append(tc.eps, cluster.RegionEndpoint{Name: name, Addr: p.Addr(), DBURL: db})
	}
	return tc
}

// addCoordinator starts one more coordinator on the shared ledger; the first one leads.
func (tc *testCluster) addCoordinator(strandAfter time.Duration) *cluster.CoordinatorNode {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := cluster.StartCoordinator(ctx, cluster.CoordinatorConfig{Listen: "127.0.0.1:0", DBURL: tc.ledger, Regions: tc.eps,
		LeaseTTL: 2 * time.Second, StrandAfter: strandAfter, RetryInterval: 200 * time.Millisecond, TLS: certs, Logger: testLogger()}, tc.etcd)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(n.Close)
	tc.coords = append(tc.coords, n)
	return n
}

func (tc *testCluster) coordinator(n *cluster.CoordinatorNode) quotav1.CoordinatorServiceClient {
	return quotav1.NewCoordinatorServiceClient(tc.connOf(n.Addr(), trust.Operator))
}

func (tc *testCluster) region(name string) quotav1.RegionServiceClient {
	return quotav1.NewRegionServiceClient(tc.connOf(tc.regions[name].Addr(), trust.Storefront))
}

func (tc *testCluster) stock(name, sale string) *quotav1.Pool {
	tc.t.Helper()
	st, err := tc.region(name).GetStock(context.Background(), &quotav1.GetStockRequest{SaleId: sale})
	if err != nil {
		tc.t.Fatal(err)
	}
	if len(st.GetPools()) == 0 {
		return &quotav1.Pool{}
	}
	return st.GetPools()[0]
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
