package coordrpc

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// GetStatus implements CoordinatorService.
func (s *Server) GetStatus(ctx context.Context, _ *quotav1.GetStatusRequest) (*quotav1.GetStatusResponse, error) {
	if s.Status == nil {
		return nil, fmt.Errorf("this coordinator gathers no cluster status (no etcd): %w", apierr.ErrNotFound)
	}
	st, err := s.Status(ctx)
	if err != nil {
		return nil, err
	}
	return StatusToProto(st), nil
}

// StatusToProto is a cluster's status as GetStatus answers it, with its problems.
func StatusToProto(st coordinator.ClusterStatus) *quotav1.GetStatusResponse {
	out := &quotav1.GetStatusResponse{At: timestamppb.New(st.At), CoordinatorLeader: st.CoordinatorLeader, Generation: st.Generation,
		Coordinators: st.Coordinators, CoordinatorDatabaseRole: st.CoordinatorDatabase, UnfinishedTransfers: st.Ledger.Unfinished,
		StrandedCount: st.Ledger.StrandedCount, Problems: coordinator.Problems(st)}
	for _, r := range st.Regions {
		rs := &quotav1.RegionStatus{Name: r.Name, Leader: r.Leader, Epoch: r.Epoch, DatabaseRole: r.Database, Error: r.Err}
		for _, p := range r.Processes {
			rs.Processes = append(rs.Processes, &quotav1.ProcessStatus{Address: p.Address, Answered: p.Err == "", Error: p.Err,
				Leading: p.Leading, Epoch: p.Epoch, StandbyRefreshMs: p.Refresh.Milliseconds(), RefreshAgeMs: msOrNone(p.RefreshAge)})
		}
		out.Regions = append(out.Regions, rs)
	}
	for _, m := range st.Etcd {
		out.Etcd = append(out.Etcd, &quotav1.EtcdMemberStatus{Name: m.Name, Endpoint: m.Endpoint, Healthy: m.Healthy, RaftLeader: m.RaftLeader, Error: m.Err})
	}
	for _, t := range st.Ledger.Stranded {
		out.Stranded = append(out.Stranded, TransferToProto(t))
	}
	for _, p := range st.Ledger.Paused {
		out.Paused = append(out.Paused, PauseToProto(p))
	}
	return out
}

// msOrNone is d in milliseconds, or -1 for a negative d (none).
func msOrNone(d time.Duration) int64 {
	if ms := d.Milliseconds(); ms >= 0 {
		return ms
	}
	return -1
}
