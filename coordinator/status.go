package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// The cluster's status as an operator reads it (quotactl status, the console's front page):
// what the coordinator's ledger says (LedgerStatus) and what the cluster package adds from
// etcd and from asking each region process (ClusterStatus); Problems says what of it needs
// a person.

// MaxStatusListed bounds the stranded transfers and the pauses a status lists.
const MaxStatusListed = 100

// Roles of a database in the status. DatabaseSingle is a database reached at one address,
// with no standby database: the only copy. A database reached at several (a managed cluster
// such as Patroni's, through a multi-host URL) is its primary, with the synchronous standby
// it names (DatabaseSynchronous, then the names) or none (DatabaseNoStandby: until one
// rejoins, its acknowledged writes are on one server); DatabaseUnknown when it cannot be read.
const (
	DatabaseSingle      = "single"
	DatabaseSynchronous = "primary, synchronous standby "
	DatabaseNoStandby   = "primary, no synchronous standby"
	DatabaseUnknown     = "unknown: "
)

// LedgerStatus is the ledger's part of the status: transfers still moving and pauses.
type LedgerStatus struct {
	// Unfinished counts the transfers neither posted nor voided (stranded ones included).
	Unfinished int64
	// Stranded lists the stranded transfers, oldest first, at most MaxStatusListed;
	// StrandedCount counts them all.
	Stranded      []transfer.Transfer
	StrandedCount int64
	// Paused lists the pauses in force, at most MaxStatusListed.
	Paused []Pause
}

// LedgerStatus reads the ledger's part of the cluster's status (quotactl status).
func (r Records) LedgerStatus(ctx context.Context) (LedgerStatus, error) {
	c := r.c
	var st LedgerStatus
	err := c.ledger.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE stranded)
		FROM transfers WHERE state IN ('requested', 'pending')`).Scan(&st.Unfinished, &st.StrandedCount)
	if err != nil {
		return st, fmt.Errorf("count unfinished transfers: %w", err)
	}
	rows, err := c.ledger.db.Query(ctx, `SELECT `+transferColumns+` FROM transfers
		WHERE stranded AND state IN ('requested', 'pending') ORDER BY created_at, transfer_id LIMIT $1`, MaxStatusListed)
	if err != nil {
		return st, fmt.Errorf("list stranded transfers: %w", err)
	}
	if st.Stranded, err = pgx.CollectRows(rows, scanTransfer); err != nil {
		return st, fmt.Errorf("list stranded transfers: %w", err)
	}
	rows, err = c.ledger.db.Query(ctx, `SELECT sale_id, sku, reason, changed_at, version FROM pauses
		WHERE paused ORDER BY sale_id, sku LIMIT $1`, MaxStatusListed)
	if err != nil {
		return st, fmt.Errorf("list pauses: %w", err)
	}
	st.Paused, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pause, error) {
		p := Pause{Paused: true}
		var version int64
		err := row.Scan(&p.Sale, &p.SKU, &p.Reason, &p.ChangedAt, &version)
		p.Version = PauseVersion(version)
		return p, err
	})
	if err != nil {
		return st, fmt.Errorf("list pauses: %w", err)
	}
	return st, nil
}

// ProcessStatus is one candidate of a region's election, as it answered NodeStatus.
type ProcessStatus struct {
	Address string
	// Err is why the process did not answer; "" when it did.
	Err     string
	Leading bool
	Epoch   int64
	// Refresh is how often it refreshes its warm copy (negative: a cold standby);
	// RefreshAge how old the copy is (negative: it has none).
	Refresh, RefreshAge time.Duration
}

// RegionStatus is one region: its election and its processes.
type RegionStatus struct {
	Name string
	// Leader is the address the election names ("" nobody leads), Epoch its term.
	Leader string
	Epoch  int64
	// Processes are the election's candidates, the leader first.
	Processes []ProcessStatus
	// Database is the role of the region's database (DatabaseSingle).
	Database string
	// Err is why the election could not be read.
	Err string
}

// EtcdMember is one etcd member's health.
type EtcdMember struct {
	Name, Endpoint string
	Healthy        bool
	RaftLeader     bool
	Err            string
}

// ClusterStatus is the whole cluster's status.
type ClusterStatus struct {
	At time.Time
	// CoordinatorLeader and Generation are what the coordinators' election names;
	// Coordinators its candidates, the leader first; CoordinatorErr why it could not be read.
	CoordinatorLeader string
	Generation        int64
	Coordinators      []string
	CoordinatorErr    string
	// CoordinatorDatabase is the role of the ledger's database (DatabaseSingle).
	CoordinatorDatabase string
	Regions             []RegionStatus
	Etcd                []EtcdMember
	Ledger              LedgerStatus
	// LedgerErr is why the ledger could not be read.
	LedgerErr string
}
