package coordhttp

import (
	"context"
	"fmt"
	"net/http"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
)

// statusJSON is GET api/status: the cluster's status as quotactl status prints it, in
// short (the front page draws it above the sales).
type statusJSON struct {
	Problems          []string           `json:"problems"`
	CoordinatorLeader string             `json:"coordinator_leader"`
	Generation        int64              `json:"generation"`
	Coordinators      []string           `json:"coordinators"`
	Regions           []regionStatusJSON `json:"regions"`
	Etcd              []etcdJSON         `json:"etcd"`
	Unfinished        int64              `json:"unfinished_transfers"`
	Stranded          int64              `json:"stranded_transfers"`
	Paused            int                `json:"paused"`
}

type regionStatusJSON struct {
	Name      string        `json:"name"`
	Leader    string        `json:"leader"`
	Epoch     int64         `json:"epoch"`
	Database  string        `json:"database"`
	Processes []processJSON `json:"processes"`
}

type processJSON struct {
	Address      string `json:"address"`
	Leading      bool   `json:"leading"`
	RefreshAgeMs int64  `json:"refresh_age_ms"`
	Error        string `json:"error,omitempty"`
}

type etcdJSON struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	Healthy  bool   `json:"healthy"`
	Leader   bool   `json:"raft_leader"`
	Error    string `json:"error,omitempty"`
}

func (h *handler) status(w http.ResponseWriter, r *http.Request, _ session) error {
	if h.opts.Status == nil {
		return fmt.Errorf("this coordinator gathers no cluster status: %w", apierr.ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	st, err := h.opts.Status(ctx)
	if err != nil {
		return err
	}
	rpcserve.WriteJSON(w, http.StatusOK, statusOf(st))
	return nil
}

// statusOf is st as GET api/status answers it.
func statusOf(st coordinator.ClusterStatus) statusJSON {
	out := statusJSON{Problems: coordinator.Problems(st), CoordinatorLeader: st.CoordinatorLeader, Generation: st.Generation,
		Coordinators: st.Coordinators, Unfinished: st.Ledger.Unfinished, Stranded: st.Ledger.StrandedCount, Paused: len(st.Ledger.Paused),
		Regions: []regionStatusJSON{}, Etcd: []etcdJSON{}}
	if out.Problems == nil {
		out.Problems = []string{}
	}
	for _, r := range st.Regions {
		rs := regionStatusJSON{Name: r.Name, Leader: r.Leader, Epoch: r.Epoch, Database: r.Database, Processes: []processJSON{}}
		for _, p := range r.Processes {
			rs.Processes = append(rs.Processes, processJSON{Address: p.Address, Leading: p.Leading, RefreshAgeMs: max(p.RefreshAge.Milliseconds(), -1), Error: p.Err})
		}
		out.Regions = append(out.Regions, rs)
	}
	for _, m := range st.Etcd {
		out.Etcd = append(out.Etcd, etcdJSON{Name: m.Name, Endpoint: m.Endpoint, Healthy: m.Healthy, Leader: m.RaftLeader, Error: m.Err})
	}
	return out
}
