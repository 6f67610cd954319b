package cluster_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/testnet"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
)

// TestStatusNamesAdvertisedStandby: a second process of region us, listening on 127.0.0.1
// but advertising localhost, is a candidate in etcd under the advertised address; the
// coordinator's GetStatus lists it there after the leader, answering as a standby with a
// warm copy, and names the missing standby coordinator as the one problem. Without
// --advertise the standby would be listed at 127.0.0.1.
func TestStatusNamesAdvertisedStandby(t *testing.T) {
	tc := newTestCluster(t, "us")
	coord := tc.addCoordinator(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := coord.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(testnet.Port(t))
	standby, err := cluster.StartRegion(ctx, cluster.RegionConfig{Region: region.Config{Name: "us", StandbyRefresh: 100 * time.Millisecond,
		Cluster: region.ClusterView{CoordinatorGeneration: tc.coordinatorGeneration}}, Listen: "127.0.0.1:" + port, Advertise: "localhost:" + port,
		DBURL: tc.eps[0].DBURL, LeaseTTL: 2 * time.Second, TLS: certs, Logger: testLogger()}, tc.etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Close)
	var st *quotav1.GetStatusResponse
	waitFor(t, "the standby listed with a warm copy", 20*time.Second, func() bool {
		st, err = tc.coordinator(coord).GetStatus(ctx, &quotav1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ps := st.GetRegions()[0].GetProcesses()
		return len(ps) == 2 && ps[1].GetRefreshAgeMs() >= 0
	})
	r := st.GetRegions()[0]
	leader, sb := r.GetProcesses()[0], r.GetProcesses()[1]
	if r.GetLeader() != tc.regions["us"].Addr() || !leader.GetLeading() || leader.GetEpoch() != r.GetEpoch() || r.GetDatabaseRole() != "single" {
		t.Errorf("region us: %v; want leader %s leading under the election's epoch, database single", r, tc.regions["us"].Addr())
	}
	if sb.GetAddress() != "localhost:"+port || !sb.GetAnswered() || sb.GetLeading() {
		t.Errorf("standby %v: want localhost:%s answering, not leading", sb, port)
	}
	if st.GetCoordinatorLeader() != coord.Addr() || len(st.GetEtcd()) != 1 || !st.GetEtcd()[0].GetHealthy() {
		t.Errorf("coordinator leader %s, etcd %v: want %s and one healthy member", st.GetCoordinatorLeader(), st.GetEtcd(), coord.Addr())
	}
	if ps := st.GetProblems(); len(ps) != 1 || !strings.HasPrefix(ps[0], "coordinators: no standby") {
		t.Errorf("problems %q: want only the missing standby coordinator", ps)
	}
}
