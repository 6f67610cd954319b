package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

const (
	// probeTimeout bounds each question the status asks: an etcd member's status, a region
	// process's NodeStatus. A paused process answers none, so this is what it costs.
	probeTimeout = 2 * time.Second
	// statusTTL is how long a status serves again before it is gathered anew: the console's
	// front page polls it, and each gathering asks every process of the cluster.
	statusTTL = 2 * time.Second
)

// statusCache gathers the cluster's status at most once per statusTTL, one gathering at a
// time (callers meanwhile wait for it).
type statusCache struct {
	mu     sync.Mutex
	at     time.Time
	last   coordinator.ClusterStatus
	gather func(ctx context.Context) coordinator.ClusterStatus
}

// get is the cached status, or a fresh one once it is older than statusTTL.
func (c *statusCache) get(ctx context.Context) (coordinator.ClusterStatus, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < statusTTL {
		return c.last, nil
	}
	st := c.gather(ctx)
	if err := ctx.Err(); err != nil {
		return st, fmt.Errorf("gather the cluster's status: %w", err)
	}
	c.last, c.at = st, time.Now()
	return st, nil
}

// gatherStatus asks the ledger, etcd (the elections and every member) and every process of
// every region, all at once, each within probeTimeout.
func (n *CoordinatorNode) gatherStatus(ctx context.Context, creds credentials.TransportCredentials) coordinator.ClusterStatus {
	st := coordinator.ClusterStatus{At: time.Now(), Regions: make([]coordinator.RegionStatus, len(n.cfg.Regions))}
	var wg sync.WaitGroup
	wg.Add(2 + len(n.cfg.Regions))
	go func() {
		defer wg.Done()
		lctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		var err error
		if st.Ledger, err = n.C.Records().LedgerStatus(lctx); err != nil {
			st.LedgerErr = err.Error()
		}
		st.CoordinatorDatabase = databaseRole(lctx, n.cfg.DBURL, n.DB)
	}()
	go func() {
		defer wg.Done()
		n.coordinatorsStatus(ctx, &st)
	}()
	for i, r := range n.cfg.Regions {
		go func(rs *coordinator.RegionStatus, db *pgxpool.Pool) {
			defer wg.Done()
			*rs = n.regionStatus(ctx, r.Name, creds)
			dctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			rs.Database = databaseRole(dctx, r.DBURL, db)
		}(&st.Regions[i], n.regionDB(i))
	}
	wg.Wait()
	return st
}

// databaseRole is the role of the database at url (pool db) as the status shows it: single for
// a URL of one host; for one of several (a managed cluster through a multi-host URL), the
// primary's synchronous standbys as it names them (synchronous_standby_names, which Patroni
// keeps), or none.
func databaseRole(ctx context.Context, url string, db *pgxpool.Pool) string {
	if hosts(url) < 2 {
		return coordinator.DatabaseSingle
	}
	if db == nil {
		return coordinator.DatabaseUnknown + "no connection"
	}
	var names string
	if err := db.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names); err != nil {
		return coordinator.DatabaseUnknown + err.Error()
	}
	if names == "" {
		return coordinator.DatabaseNoStandby
	}
	return coordinator.DatabaseSynchronous + names
}

// hosts counts the distinct servers (host and port) a PostgreSQL URL names; 0 when it does not
// parse. pgconn lists a server again for each TLS mode it may try (sslmode=prefer).
func hosts(url string) int {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return 0
	}
	seen := map[string]bool{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))): true}
	for _, f := range cfg.Fallbacks {
		seen[net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port)))] = true
	}
	return len(seen)
}

// regionDB is the pool of the i-th region's database, nil when it was not opened.
func (n *CoordinatorNode) regionDB(i int) *pgxpool.Pool {
	if i < len(n.regionDBs) {
		return n.regionDBs[i]
	}
	return nil
}

// coordinatorsStatus fills in the coordinators' election and etcd's members.
func (n *CoordinatorNode) coordinatorsStatus(ctx context.Context, st *coordinator.ClusterStatus) {
	if n.etcd == nil {
		st.CoordinatorErr = "this coordinator runs without etcd"
		return
	}
	cands, err := fencing.Candidates(ctx, n.etcd, "coordinator", probeTimeout)
	if err != nil {
		st.CoordinatorErr = err.Error()
	} else if len(cands) > 0 {
		st.CoordinatorLeader, st.Generation = cands[0].Value, cands[0].Revision
		for _, c := range cands {
			st.Coordinators = append(st.Coordinators, c.Value)
		}
	}
	for _, m := range fencing.Members(ctx, n.etcd, probeTimeout) {
		st.Etcd = append(st.Etcd, coordinator.EtcdMember{Name: m.Name, Endpoint: m.Endpoint, Healthy: m.Healthy, RaftLeader: m.RaftLeader, Err: m.Err})
	}
}

// regionStatus reads region name's election and asks each of its candidates NodeStatus.
func (n *CoordinatorNode) regionStatus(ctx context.Context, name string, creds credentials.TransportCredentials) coordinator.RegionStatus {
	rs := coordinator.RegionStatus{Name: name}
	if n.etcd == nil {
		rs.Err = "this coordinator runs without etcd"
		return rs
	}
	cands, err := fencing.Candidates(ctx, n.etcd, "region/"+name, probeTimeout)
	if err != nil {
		rs.Err = err.Error()
		return rs
	}
	if len(cands) > 0 {
		rs.Leader, rs.Epoch = cands[0].Value, cands[0].Revision
	}
	rs.Processes = make([]coordinator.ProcessStatus, len(cands))
	var wg sync.WaitGroup
	for i, c := range cands {
		wg.Add(1)
		go func(p *coordinator.ProcessStatus) {
			defer wg.Done()
			*p = askProcess(ctx, name, c.Value, creds)
		}(&rs.Processes[i])
	}
	wg.Wait()
	return rs
}

// askProcess asks the region process at addr NodeStatus, within probeTimeout.
func askProcess(ctx context.Context, region, addr string, creds credentials.TransportCredentials) coordinator.ProcessStatus {
	p := coordinator.ProcessStatus{Address: addr, Refresh: -1, RefreshAge: -1}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithUnaryInterceptor(rpcserve.WithRegion(region)))
	if err != nil {
		p.Err = err.Error()
		return p
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	resp, err := quotav1.NewParticipantServiceClient(conn).NodeStatus(cctx, &quotav1.NodeStatusRequest{})
	if err != nil {
		p.Err = apierr.FromStatus(err).Error()
		return p
	}
	p.Leading, p.Epoch = resp.GetLeading(), resp.GetEpoch()
	p.Refresh = time.Duration(resp.GetStandbyRefreshMs()) * time.Millisecond
	if a := resp.GetRefreshAgeMs(); a >= 0 {
		p.RefreshAge = time.Duration(a) * time.Millisecond
	}
	return p
}
