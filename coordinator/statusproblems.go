package coordinator

import (
	"fmt"
	"strings"
	"time"
)

// StaleAfter is how old a standby's warm copy may grow before the status calls it stale:
// three refresh intervals, and never less than 10 s (a refresh of a large region takes a
// while, and a busy database slows it).
func StaleAfter(refresh time.Duration) time.Duration { return max(3*refresh, 10*time.Second) }

// Problems says what of s needs a person, one line each: a region or the coordinators
// without a leader or a standby, a process that does not answer or lags, an etcd member
// that is not healthy, stranded transfers, and whatever could not be read. Pauses and
// unfinished transfers that are not stranded are the cluster at work, not problems.
func Problems(s ClusterStatus) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	switch {
	case s.CoordinatorErr != "":
		add("coordinators: election unreadable: %s", s.CoordinatorErr)
	case s.CoordinatorLeader == "":
		add("coordinators: nobody leads: no allocation, transfer or pause can be made")
	case len(s.Coordinators) < 2:
		add("coordinators: no standby: the next failure of %s stops allocation until it restarts", s.CoordinatorLeader)
	}
	for _, r := range s.Regions {
		out = append(out, regionProblems(r)...)
	}
	for _, m := range s.Etcd {
		if !m.Healthy {
			add("etcd member %s (%s): not healthy: %s", orUnnamed(m.Name), m.Endpoint, m.Err)
		}
	}
	if s.LedgerErr != "" {
		add("ledger: unreadable: %s", s.LedgerErr)
	}
	if why := databaseProblem(s.CoordinatorDatabase); why != "" {
		add("ledger's database: %s", why)
	}
	for _, t := range s.Ledger.Stranded {
		add("transfer %s (%s/%s, %d units %s -> %s): stranded in %s since %s: %s (quotactl transfer resolve)",
			t.ID, t.Sale, t.SKU, t.Units, t.From, t.To, t.State, t.CreatedAt.UTC().Format(time.RFC3339), t.Reason)
	}
	if more := s.Ledger.StrandedCount - int64(len(s.Ledger.Stranded)); more > 0 {
		add("transfers: %d more stranded (quotactl transfers --stranded)", more)
	}
	return out
}

func orUnnamed(name string) string {
	if name == "" {
		return "(unnamed)"
	}
	return name
}

// regionProblems are region r's problems: its election, its leader, its standbys.
func regionProblems(r RegionStatus) []string {
	var out []string
	add := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("region %s: "+format, append([]any{r.Name}, args...)...))
	}
	if r.Err != "" {
		add("election unreadable: %s", r.Err)
		return out
	}
	if r.Leader == "" {
		add("nobody leads: the region refuses every reservation")
	}
	standbys := 0
	for _, p := range r.Processes {
		switch {
		case p.Err != "" && p.Address == r.Leader:
			add("leader %s (epoch %d) does not answer: %s; a standby takes over when its lease expires", p.Address, r.Epoch, p.Err)
		case p.Err != "":
			add("standby %s does not answer: %s", p.Address, p.Err)
		case p.Address == r.Leader && !p.Leading:
			add("leader %s (epoch %d) is elected but not serving yet (taking over, or reloading)", p.Address, r.Epoch)
		case p.Address == r.Leader && p.Epoch != r.Epoch:
			add("leader %s serves under epoch %d, the election's is %d", p.Address, p.Epoch, r.Epoch)
		case p.Address != r.Leader && p.Leading:
			add("%s still serves as leader under epoch %d, but the election names %s (epoch %d)", p.Address, p.Epoch, r.Leader, r.Epoch)
		case p.Address != r.Leader:
			standbys++
			if p.Refresh >= 0 && p.RefreshAge > StaleAfter(p.Refresh) {
				add("standby %s: its warm copy is %s old (refreshed every %s): a takeover would load every hold", p.Address, p.RefreshAge.Round(time.Millisecond), p.Refresh)
			}
		}
	}
	if r.Leader != "" && standbys == 0 {
		add("no standby answers: the next failure of the leader stops the region until a process restarts")
	}
	if why := databaseProblem(r.Database); why != "" {
		add("database: %s", why)
	}
	return out
}

// databaseProblem is what needs a person in a database's role, "" when nothing does.
func databaseProblem(role string) string {
	switch {
	case role == DatabaseNoStandby:
		return "the primary has no synchronous standby: its acknowledged writes are on one server until one rejoins"
	case strings.HasPrefix(role, DatabaseUnknown):
		return "its role cannot be read: " + strings.TrimPrefix(role, DatabaseUnknown)
	}
	return ""
}
