package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/transfer"
)

// healthy is a status with nothing wrong: two coordinators, a region with a leader and a
// fresh standby, three healthy etcd members.
func healthy() coordinator.ClusterStatus {
	return coordinator.ClusterStatus{CoordinatorLeader: "c1:7400", Generation: 5, Coordinators: []string{"c1:7400", "c2:7400"},
		Regions: []coordinator.RegionStatus{{Name: "us", Leader: "u1:7401", Epoch: 9, Processes: []coordinator.ProcessStatus{
			{Address: "u1:7401", Leading: true, Epoch: 9, Refresh: time.Second, RefreshAge: -1},
			{Address: "u2:7401", Refresh: time.Second, RefreshAge: 300 * time.Millisecond}}}},
		Etcd: []coordinator.EtcdMember{{Name: "e1", Healthy: true, RaftLeader: true}, {Name: "e2", Healthy: true}, {Name: "e3", Healthy: true}}}
}

// TestProblems: each fault of the status is a problem line naming what and where, and a
// healthy cluster, with pauses and transfers under way, has none.
func TestProblems(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(s *coordinator.ClusterStatus)
		want   string // a substring of the one problem; "" for none
	}{
		{"healthy, with a pause and a transfer under way", func(s *coordinator.ClusterStatus) {
			s.Ledger.Unfinished = 1
			s.Ledger.Paused = []coordinator.Pause{{Sale: "s", Paused: true}}
		}, ""},
		{"no coordinator leader", func(s *coordinator.ClusterStatus) { s.CoordinatorLeader, s.Coordinators = "", nil }, "coordinators: nobody leads"},
		{"no coordinator standby", func(s *coordinator.ClusterStatus) { s.Coordinators = s.Coordinators[:1] }, "coordinators: no standby"},
		{"region leader silent", func(s *coordinator.ClusterStatus) { s.Regions[0].Processes[0].Err = "connection refused" },
			"region us: leader u1:7401 (epoch 9) does not answer: connection refused"},
		{"standby silent", func(s *coordinator.ClusterStatus) { s.Regions[0].Processes[1].Err = "deadline exceeded" },
			"region us: standby u2:7401 does not answer"},
		{"no standby", func(s *coordinator.ClusterStatus) { s.Regions[0].Processes = s.Regions[0].Processes[:1] }, "region us: no standby"},
		{"a region's database with its synchronous standby", func(s *coordinator.ClusterStatus) {
			s.Regions[0].Database = coordinator.DatabaseSynchronous + `"db-us-2"`
		}, ""},
		{"a region's database without its synchronous standby", func(s *coordinator.ClusterStatus) { s.Regions[0].Database = coordinator.DatabaseNoStandby },
			"region us: database: the primary has no synchronous standby"},
		{"the ledger's database unreadable", func(s *coordinator.ClusterStatus) { s.CoordinatorDatabase = coordinator.DatabaseUnknown + "timeout" },
			"ledger's database: its role cannot be read: timeout"},
		{"stale standby", func(s *coordinator.ClusterStatus) { s.Regions[0].Processes[1].RefreshAge = 11 * time.Second },
			"region us: standby u2:7401: its warm copy is 11s old"},
		{"nobody leads", func(s *coordinator.ClusterStatus) {
			s.Regions[0].Leader, s.Regions[0].Processes = "", nil
		}, "region us: nobody leads"},
		{"old leader still serving", func(s *coordinator.ClusterStatus) { s.Regions[0].Processes[1].Leading = true },
			"region us: u2:7401 still serves as leader"},
		{"etcd member down", func(s *coordinator.ClusterStatus) {
			s.Etcd[2].Healthy, s.Etcd[2].Err = false, "context deadline exceeded"
		},
			"etcd member e3 (): not healthy: context deadline exceeded"},
		{"stranded transfer", func(s *coordinator.ClusterStatus) {
			s.Ledger.Stranded = []transfer.Transfer{{ID: "t1", Sale: "s", SKU: "k", Units: 10, From: "unallocated", To: "eu", State: transfer.Pending, Reason: "unreachable"}}
			s.Ledger.StrandedCount = 1
		}, "transfer t1 (s/k, 10 units unallocated -> eu): stranded in pending"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := healthy()
			tc.mutate(&s)
			ps := coordinator.Problems(s)
			if tc.want == "" {
				if len(ps) != 0 {
					t.Fatalf("problems %q, want none", ps)
				}
				return
			}
			for _, p := range ps {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Fatalf("problems %q, want one with %q", ps, tc.want)
		})
	}
}
