package fencing

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCampaignEndsWhenItsSessionExpires: a candidate whose lease ends while it waits (its
// member paused past the TTL, here the lease revoked) is no candidate any more, and its
// Campaign returns ErrSessionExpired instead of waiting on, so the caller campaigns again
// and is listed as a standby again. Candidates lists the leader first, then the standbys.
func TestCampaignEndsWhenItsSessionExpires(t *testing.T) {
	_, c := startInternalEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leader, err := Campaign(ctx, c, "region/x", "a:1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	done := make(chan error, 1)
	go func() {
		l, err := Campaign(ctx, c, "region/x", "b:1", 5*time.Second)
		if err == nil {
			l.Close()
		}
		done <- err
	}()
	var cands []Candidate
	for len(cands) < 2 {
		if cands, err = Candidates(ctx, c, "region/x", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cands[0].Value != "a:1" || cands[0].Revision != leader.Generation || cands[1].Value != "b:1" {
		t.Fatalf("candidates %+v: want a:1 (generation %d) then b:1", cands, leader.Generation)
	}
	leases, err := c.c.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Leases {
		if l.ID != leader.session.Lease() {
			if _, err := c.c.Revoke(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrSessionExpired) {
			t.Fatalf("campaign after its lease ended: %v, want ErrSessionExpired", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the campaign still waits 10 s after its lease ended")
	}
	if cands, err = Candidates(ctx, c, "region/x", 2*time.Second); err != nil || len(cands) != 1 {
		t.Fatalf("candidates after: %+v, %v; want the leader alone", cands, err)
	}
}

// TestMembersReportEachMember: every member of a running etcd answers healthy, named, and
// one is the raft leader.
func TestMembersReportEachMember(t *testing.T) {
	_, c := startInternalEtcd(t)
	ms := Members(context.Background(), c, 2*time.Second)
	if len(ms) != 1 || !ms[0].Healthy || !ms[0].RaftLeader || ms[0].Name == "" || ms[0].Endpoint == "" {
		t.Fatalf("members %+v: want one healthy, named raft leader", ms)
	}
}
