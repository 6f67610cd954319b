package fencing

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxCandidates bounds the candidates Candidates reads of one role.
const MaxCandidates = 64

// Candidate is one process campaigning for a role: what it published (its address) and
// the revision its candidacy was created at. The one created first leads; its revision is
// the leader's generation (or, for a region, its epoch).
type Candidate struct {
	Value    string
	Revision int64
}

// Candidates lists role's candidates, the leader first, at most MaxCandidates, within
// timeout. A process
// whose lease has expired (killed, or cut off for longer than its TTL) is no longer listed.
func Candidates(ctx context.Context, c *Client, role string, timeout time.Duration) ([]Candidate, error) {
	var resp *clientv3.GetResponse
	var err error
	for range 2 { // as memberList: the second request goes to another endpoint
		gctx, cancel := context.WithTimeout(ctx, timeout/2)
		resp, err = c.c.Get(gctx, electionKey(role)+"/", clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(MaxCandidates))
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("candidates of %s: %w", role, err)
	}
	out := make([]Candidate, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, Candidate{Value: string(kv.Value), Revision: kv.CreateRevision})
	}
	return out, nil
}

// MemberHealth is one etcd member as it answered a status request of its own.
type MemberHealth struct {
	Name     string
	Endpoint string
	// Healthy is true when the member answered within the timeout and knows a raft leader.
	Healthy bool
	// RaftLeader is true when this member is the raft leader.
	RaftLeader bool
	// Err says why the member is not healthy.
	Err string
}

// MaxMembers bounds the members Members asks.
const MaxMembers = 16

// Members asks every member of the cluster, each at its own client URL and within timeout,
// for its status. The member list comes from the cluster (MemberList); when that fails, the
// client's endpoints are asked instead, unnamed.
func Members(ctx context.Context, c *Client, timeout time.Duration) []MemberHealth {
	var out []MemberHealth
	list, err := memberList(ctx, c, timeout)
	if err == nil {
		for _, m := range list.Members {
			h := MemberHealth{Name: m.Name}
			if len(m.ClientURLs) > 0 {
				h.Endpoint = m.ClientURLs[0]
			}
			out = append(out, h)
		}
	} else {
		for _, ep := range c.c.Endpoints() {
			out = append(out, MemberHealth{Endpoint: ep})
		}
	}
	if len(out) > MaxMembers {
		out = out[:MaxMembers]
	}
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func(h *MemberHealth) {
			defer wg.Done()
			askMember(ctx, c, h, timeout)
		}(&out[i])
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Endpoint < out[j].Endpoint })
	return out
}

// memberList asks for the member list twice, each within half of timeout: a request the
// client sends to a member that does not answer (paused, cut off) waits for its deadline,
// and the next goes to another endpoint.
func memberList(ctx context.Context, c *Client, timeout time.Duration) (*clientv3.MemberListResponse, error) {
	var err error
	for range 2 {
		lctx, cancel := context.WithTimeout(ctx, timeout/2)
		var list *clientv3.MemberListResponse
		list, err = c.c.MemberList(lctx)
		cancel()
		if err == nil {
			return list, nil
		}
	}
	return nil, fmt.Errorf("etcd member list: %w", err)
}

// askMember fills h from the status its member answers.
func askMember(ctx context.Context, c *Client, h *MemberHealth, timeout time.Duration) {
	if h.Endpoint == "" {
		h.Err = "the member has no client URL (not started yet?)"
		return
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := c.c.Status(sctx, h.Endpoint)
	switch {
	case err != nil:
		h.Err = err.Error()
	case st.Leader == 0:
		h.Err = "knows no raft leader"
	case len(st.Errors) > 0:
		h.Err = fmt.Sprintf("reports %v", st.Errors)
	default:
		h.Healthy = true
		h.RaftLeader = st.Header.GetMemberId() == st.Leader
	}
}
