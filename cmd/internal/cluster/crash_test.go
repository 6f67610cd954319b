package cluster_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/coordinator/coordrpc"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// faulty wraps a real participant: for the call kinds in before it fails without calling
// (the coordinator died before the step); for those in after it calls and then reports
// failure (the reply was lost, or the coordinator died right after the step).
type faulty struct {
	coordinator.Participant
	mu            sync.Mutex
	before, after map[string]bool
}

var errInjected = errors.New("injected: reply lost")

func (f *faulty) fault(kind string) (before, after bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.before[kind], f.after[kind]
}

func (f *faulty) Debit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	b, a := f.fault("debit")
	if b {
		return "", errInjected
	}
	st, err := f.Participant.Debit(ctx, gen, t)
	if a && err == nil {
		return "", errInjected
	}
	return st, err
}

func (f *faulty) Credit(ctx context.Context, gen int64, t transfer.Transfer) (transfer.InState, error) {
	b, a := f.fault("credit")
	if b {
		return "", errInjected
	}
	st, err := f.Participant.Credit(ctx, gen, t)
	if a && err == nil {
		return "", errInjected
	}
	return st, err
}

func (f *faulty) Settle(ctx context.Context, gen int64, t transfer.Transfer) (transfer.OutState, error) {
	b, a := f.fault("settle")
	if b {
		return "", errInjected
	}
	st, err := f.Participant.Settle(ctx, gen, t)
	if a && err == nil {
		return "", errInjected
	}
	return st, err
}

// rawCoordinator builds a coordinator on the cluster's ledger whose participants go through
// faulty wrappers, leading with gen (SQL fences only need generations to rise).
func (tc *testCluster) rawCoordinator(t *testing.T, gen int64, before, after map[string]bool) *coordinator.Coordinator {
	t.Helper()
	ctx := context.Background()
	db, err := pgutil.Open(ctx, tc.ledger, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	var links []coordinator.RegionLink
	for _, ep := range tc.eps {
		p, err := coordrpc.DialParticipant(ep.Addr, creds(t, trust.Coordinator))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		rdb, err := pgutil.Open(ctx, ep.DBURL, 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rdb.Close)
		name := ep.Name
		links = append(links, coordinator.RegionLink{Name: name, Address: ep.Addr, Participant: &faulty{Participant: p, before: before, after: after},
			Books: func(ctx context.Context, sale string) (transfer.RegionBooks, error) {
				return region.ReadBooks(ctx, rdb, name, sale)
			}})
	}
	c, err := coordinator.New(coordinator.Config{Regions: links, RetryInterval: time.Hour, StrandAfter: time.Hour, Logger: testLogger()}, db)
	if err != nil {
		t.Fatal(err)
	}
	for old := tc.rawGen.Load(); gen > old && !tc.rawGen.CompareAndSwap(old, gen); old = tc.rawGen.Load() {
	}
	if err := c.Lead(ctx, gen); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func mustAudit(t *testing.T, c *coordinator.Coordinator, sale, when string) coordinator.SKUAudit {
	t.Helper()
	rep, err := c.Audit(context.Background(), sale)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("%s: audit violations %+v", when, rep.Violations)
	}
	return rep.SKUs[0]
}

// TestCrashPoints: for each protocol step, the coordinator dies (or loses the reply) right
// after it; a new leader resumes the transfer to posted; the audit is clean at every moment;
// the source is debited once and the destination credited once.
func TestCrashPoints(t *testing.T) {
	t.Parallel() // its own cluster, no time bound (newTestCluster)
	cases := []struct {
		step          string
		before, after map[string]bool
		stuck         transfer.State
	}{
		{"1 requested (dies before the debit)", map[string]bool{"debit": true}, nil, transfer.Requested},
		{"2 debited (reply lost)", nil, map[string]bool{"debit": true}, transfer.Requested},
		{"3 pending (dies before the credit)", map[string]bool{"credit": true}, nil, transfer.Pending},
		{"4 credited (reply lost)", nil, map[string]bool{"credit": true}, transfer.Pending},
		{"5 posted (settle reply lost)", nil, map[string]bool{"settle": true}, transfer.Posted},
	}
	tc := newTestCluster(t, "us", "eu")
	c := leader(t, tc)
	createSale2(t, c, "s", 1000) // us 500, eu 500
	for i, k := range cases {
		t.Run(k.step, func(t *testing.T) {
			gen := int64(1000 + 10*i)
			old := tc.rawCoordinator(t, gen, k.before, k.after)
			req := coordinator.TransferRequest{Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 10, RequestID: "crash-" + itoa(i)}
			got, _, err := old.Transfer(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != k.stuck {
				t.Fatalf("after the crash the transfer is %s; want %s", got.State, k.stuck)
			}
			mustAudit(t, old, "s", "after the crash")
			old.Close()
			fresh := tc.rawCoordinator(t, gen+5, nil, nil)
			if _, err := fresh.Resolve(context.Background(), got.ID, false); err != nil {
				t.Fatal(err)
			}
			done, err := fresh.GetTransfer(context.Background(), got.ID)
			if err != nil || done.State != transfer.Posted || !done.Settled {
				t.Fatalf("after the new leader: %+v, %v; want posted and settled", done, err)
			}
			a := mustAudit(t, fresh, "s", "after recovery")
			if a.InFlight != 0 {
				t.Fatalf("in flight %d after recovery", a.InFlight)
			}
		})
	}
	us, eu := tc.stock("us", "s"), tc.stock("eu", "s")
	if us.GetDebitedOut() != 50 || eu.GetCreditedIn() != 550 || us.GetAvailable() != 450 || eu.GetAvailable() != 550 {
		t.Fatalf("after five transfers of 10: us %v, eu %v; want each debited and credited once", us, eu)
	}
}

// TestZombieCoordinatorIsFenced: leader A keeps running after B took over with a higher
// generation and moved stock; everything A then sends (ledger writes and region calls) is
// refused as FENCED and changes nothing.
func TestZombieCoordinatorIsFenced(t *testing.T) {
	tc := newTestCluster(t, "us", "eu")
	c := leader(t, tc)
	createSale2(t, c, "s", 1000)
	ctx := context.Background()
	a := tc.rawCoordinator(t, 500, nil, nil)
	b := tc.rawCoordinator(t, 600, nil, nil)
	if got, _, err := b.Transfer(ctx, coordinator.TransferRequest{Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 100, RequestID: "by-b"}); err != nil || got.State != transfer.Posted {
		t.Fatalf("B's transfer: %+v, %v", got, err)
	}
	usBefore, euBefore := tc.stock("us", "s"), tc.stock("eu", "s")
	if _, _, err := a.Transfer(ctx, coordinator.TransferRequest{Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 50, RequestID: "by-a"}); !errors.Is(err, apierr.ErrFenced) {
		t.Fatalf("zombie's ledger write: %v; want FENCED", err)
	}
	// A's queued region calls, sent late with its old generation.
	p, err := coordrpc.DialParticipant(tc.eps[0].Addr, creds(t, trust.Coordinator))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	late := transfer.Transfer{ID: "t-zombie", Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 50}
	if _, err := p.Debit(ctx, 500, late); !errors.Is(err, apierr.ErrFenced) {
		t.Fatalf("zombie's debit: %v; want FENCED", err)
	}
	pe, err := coordrpc.DialParticipant(tc.eps[1].Addr, creds(t, trust.Coordinator))
	if err != nil {
		t.Fatal(err)
	}
	defer pe.Close()
	if _, err := pe.Credit(ctx, 500, late); !errors.Is(err, apierr.ErrFenced) {
		t.Fatalf("zombie's credit: %v; want FENCED", err)
	}
	if err := pe.PutSale(ctx, 500, coordinator.SaleTerms{Sale: "s", SKUs: []string{"phone"}, PerUserLimit: 9, HoldTTL: time.Minute}); !errors.Is(err, apierr.ErrFenced) {
		t.Fatalf("zombie's put sale: %v; want FENCED", err)
	}
	if us, eu := tc.stock("us", "s"), tc.stock("eu", "s"); us.GetAvailable() != usBefore.GetAvailable() || eu.GetAvailable() != euBefore.GetAvailable() {
		t.Fatalf("zombie changed stock: us %v → %v, eu %v → %v", usBefore, us, euBefore, eu)
	}
	mustAudit(t, b, "s", "after the zombie")
}

// TestCancelRequestedTransfer: a transfer left requested (the debit never reached the
// source, or its reply was lost) is cancelled by resolve --refuse through the source's own
// record. Never debited: the source tombstones it, the ledger voids it, a late debit answers
// refused and nothing moves. Debited: the ledger learns it, the destination refuses it, the
// source restores it. Either way the audit is clean and the source ends where it started.
func TestCancelRequestedTransfer(t *testing.T) {
	tc := newTestCluster(t, "us", "eu")
	c := leader(t, tc)
	createSale2(t, c, "s", 1000) // us 500, eu 500
	tc.coords[0].Close()         // its driver would debit the stuck transfers before the cancel
	ctx := context.Background()
	cases := []struct {
		name          string
		before, after map[string]bool
		reason        string
	}{
		{"never debited", map[string]bool{"debit": true}, nil, "cancelled: us refused the debit"},
		{"debited, reply lost", nil, map[string]bool{"debit": true}, "refused by eu"},
	}
	for i, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			gen := int64(2000 + 10*i)
			old := tc.rawCoordinator(t, gen, k.before, k.after)
			got, _, err := old.Transfer(ctx, coordinator.TransferRequest{Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 10, RequestID: "cancel-" + itoa(i)})
			if err != nil || got.State != transfer.Requested {
				t.Fatalf("transfer with the debit's reply lost: %+v, %v; want requested", got, err)
			}
			old.Close()
			// The new leader's background driver would race the cancel (a debit or a credit
			// landing first ends the transfer posted, which is also safe): block its steps.
			fresh := tc.rawCoordinator(t, gen+5, map[string]bool{"debit": true, "credit": true}, nil)
			done, err := fresh.Resolve(ctx, got.ID, true)
			if err != nil || done.State != transfer.Voided || done.Reason != k.reason {
				t.Fatalf("resolve --refuse: %+v, %v; want voided, %q", done, err, k.reason)
			}
			if a := mustAudit(t, fresh, "s", "after the cancel"); a.InFlight != 0 {
				t.Fatalf("in flight %d after the cancel", a.InFlight)
			}
			// The old leader's debit, arriving late, cannot take the units any more.
			p, err := coordrpc.DialParticipant(tc.eps[0].Addr, creds(t, trust.Coordinator))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if st, err := p.Debit(ctx, gen+5, done); err != nil || st == transfer.OutPending {
				t.Fatalf("late debit after the cancel: %s, %v; want refused or voided", st, err)
			}
			mustAudit(t, fresh, "s", "after the late debit")
		})
	}
	if us, eu := tc.stock("us", "s"), tc.stock("eu", "s"); us.GetAvailable() != 500 || eu.GetAvailable() != 500 {
		t.Fatalf("after two cancelled transfers: us %v, eu %v; want 500 each", us, eu)
	}
	// A silent source: only it knows whether it debited, so the transfer stays requested.
	old := tc.rawCoordinator(t, 3000, map[string]bool{"debit": true}, nil)
	got, _, err := old.Transfer(ctx, coordinator.TransferRequest{Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 10, RequestID: "cancel-silent"})
	if err != nil || got.State != transfer.Requested {
		t.Fatalf("transfer: %+v, %v", got, err)
	}
	tc.proxies["us"].Cut()
	if still, err := old.Resolve(ctx, got.ID, true); err != nil || still.State != transfer.Requested || still.Reason == "" {
		t.Fatalf("resolve --refuse with the source cut off: %+v, %v; want still requested, with a reason", still, err)
	}
	if stored, err := old.GetTransfer(ctx, got.ID); err != nil || stored.Stranded || !strings.Contains(stored.Reason, "refuse debit at us") {
		t.Fatalf("the ledger's row: %+v, %v; want the failed step's reason recorded before any stranding", stored, err)
	}
	tc.proxies["us"].Heal()
	mustAudit(t, old, "s", "after the failed cancel")
}
