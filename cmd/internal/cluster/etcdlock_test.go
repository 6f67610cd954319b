package cluster_test

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator/coordrpc"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/etcdattack"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// etcdRoot is etcd's administrator in the package's certificates.
func etcdRoot() etcdattack.Identity {
	return etcdattack.Identity{Name: "root", Cert: filepath.Join(certs.Dir(), trust.EtcdCert(trust.EtcdRoot)),
		Key: filepath.Join(certs.Dir(), trust.EtcdKey(trust.EtcdRoot))}
}

// etcdAs runs etcdctl against the dev cluster's etcd as id.
func etcdAs(t *testing.T, d *cluster.Dev, id etcdattack.Identity, args ...string) string {
	t.Helper()
	out, err := etcdattack.Run(context.Background(), d.Etcd.ClientURL, filepath.Join(certs.Dir(), trust.CACert), id, args...)
	if err != nil {
		t.Fatalf("etcdctl %v as %s: %v: %s", args, id.Name, err, out)
	}
	return out
}

// electionLease is the lease id that ends an election key.
var electionLease = regexp.MustCompile(`(?m)^(/quota/election/[^\n]*/)[0-9a-f]+$`)

// electionsAnyLease blanks the lease ids of election keys in etcdctl's output: a leader whose
// lease lapses on a busy machine campaigns again under a new one, at the same address. Each
// attack on an election is checked refused on its own (wantAllRefused).
func electionsAnyLease(out string) string { return electionLease.ReplaceAllString(out, "${1}<lease>") }

// TestEtcdWritesAreRefused replays with etcdctl every etcd write that hurt a sale while etcd
// trusted anyone who reached it, with no certificate and with each client certificate of the
// cluster's CA, against quotad dev's embedded etcd: each is refused, etcd holds what it held,
// no buyer gets past the per-user limit, and the sale then sells exactly its stock with a
// clean audit. A region's own etcd user may
// not touch another region's election, the coordinator's, or the stock flags either.
func TestEtcdWritesAreRefused(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	d := startDev(t, "us", "eu", "ap")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale(t, op, "s", 30, 2, 10*time.Minute)
	rcs := map[string]quotav1.RegionServiceClient{}
	for _, n := range d.Regions {
		rcs[n.R.Name()] = quotav1.NewRegionServiceClient(dial(t, n.Addr(), trust.Storefront))
	}
	greedy, err := rcs["us"].Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "greedy-2", Quantity: 2, RequestKey: "g1"})
	if err != nil {
		t.Fatal(err)
	}

	root := etcdRoot()
	leaderKey := strings.TrimSpace(etcdAs(t, d, root, "get", "--prefix", "--keys-only", "--sort-by=CREATE", "--limit=1", "/quota/election/region/eu/"))
	if !strings.HasPrefix(leaderKey, "/quota/election/region/eu/") {
		t.Fatalf("eu's leader key: %q", leaderKey)
	}
	before := electionsAnyLease(etcdAs(t, d, root, "get", "--prefix", "/quota/"))
	attempts := etcdattack.Attempts("s", "phone", "greedy-2", "victim-1", "eu", leaderKey)
	ca := filepath.Join(certs.Dir(), trust.CACert)
	results, err := etcdattack.Replay(ctx, d.Etcd.ClientURL, ca, etcdattack.Identities(certs.Dir()), attempts)
	if err != nil {
		t.Fatal(err)
	}
	us := etcdattack.Identity{Name: "etcd.region-us.crt", Cert: filepath.Join(certs.Dir(), trust.EtcdCert(trust.EtcdRegion("us"))),
		Key: filepath.Join(certs.Dir(), trust.EtcdKey(trust.EtcdRegion("us")))}
	regional, err := etcdattack.Replay(ctx, d.Etcd.ClientURL, ca, []etcdattack.Identity{us}, attempts[2:7]) // flags and elections
	if err != nil {
		t.Fatal(err)
	}
	peerRefuses(t, d.Etcd.PeerURL, ca)
	if err != nil {
		t.Fatal(err)
	}
	wantAllRefused(t, append(results, regional...), len(attempts)*6+5)
	if after := electionsAnyLease(etcdAs(t, d, root, "get", "--prefix", "/quota/")); after != before {
		t.Fatalf("etcd changed under the attacks:\nbefore %s\nafter  %s", before, after)
	}

	if _, err := rcs["eu"].Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "victim-1", Quantity: 1, RequestKey: "v1"}); err != nil {
		t.Fatalf("victim-1 at eu after the attacks: %v", err)
	}
	for _, r := range []string{"eu", "ap"} { // the per-user limit of 2 holds across regions
		_, err := rcs[r].Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "greedy-2", Quantity: 2, RequestKey: "g-" + r})
		if apierr.Reason(err) != "BOUND_ELSEWHERE" {
			t.Errorf("greedy-2 at %s after the attacks: %v; want BOUND_ELSEWHERE (bound to us, 2 units held there)", r, err)
		}
	}
	sold := sellEach(t, ctx, rcs) + 1 + 2
	if _, err := rcs["us"].Confirm(ctx, &quotav1.ConfirmRequest{HoldId: greedy.GetReservation().GetHoldId(), PaymentId: "pay-g"}); err != nil {
		t.Fatal(err)
	}
	if sold != 30 {
		t.Errorf("the sale placed %d units; want exactly its stock, 30", sold)
	}
	auditOK(t, op, "s")
}

// peerRefuses checks that an etcd member's peer port refuses every certificate of the CA but
// node.crt at the handshake: etcd checks no user there.
func peerRefuses(t *testing.T, peerURL, ca string) {
	t.Helper()
	node := etcdattack.Identity{Name: "node.crt", Cert: filepath.Join(certs.Dir(), trust.NodeCert), Key: filepath.Join(certs.Dir(), trust.NodeKey)}
	for _, id := range append(etcdattack.Identities(certs.Dir())[1:], etcdRoot()) {
		if id.Name == node.Name {
			continue
		}
		if refused, err := etcdattack.HandshakeRefused(peerURL, ca, id); err != nil || !refused {
			t.Errorf("the peer port and %s: refused %v, %v; want refused at the handshake", id.Name, refused, err)
		}
	}
	if refused, err := etcdattack.HandshakeRefused(peerURL, ca, node); err != nil || refused {
		t.Errorf("the peer port and node.crt: refused %v, %v; want served", refused, err)
	}
}

// wantAllRefused fails the test for every attempt etcd accepted; a certificate's attempt must
// be refused by etcd's authorization (permission denied), not by chance.
func wantAllRefused(t *testing.T, results []etcdattack.Result, want int) {
	t.Helper()
	if len(results) != want {
		t.Fatalf("%d attempts ran; want %d", len(results), want)
	}
	for _, r := range results {
		switch {
		case !r.Refused:
			t.Errorf("%s: %s: accepted: %s", r.Identity, r.What, r.Output)
		case r.Identity != "no certificate" && !r.Denied && !r.Handshake:
			t.Errorf("%s: %s: failed, but neither as permission denied nor at the handshake: %s", r.Identity, r.What, r.Output)
		}
	}
}

// sellEach reserves one unit at a time for new buyers at every region until each answers
// REGION_EXHAUSTED or SOLD_OUT, and returns the units reserved.
func sellEach(t *testing.T, ctx context.Context, rcs map[string]quotav1.RegionServiceClient) int {
	t.Helper()
	n := 0
	for name, rc := range rcs {
		for i := 0; ; i++ {
			if i == 100 {
				t.Fatalf("%s: still selling after 100 buyers", name)
			}
			_, err := rc.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: fmt.Sprintf("b-%s-%d", name, i), Quantity: 1,
				RequestKey: "k"})
			if r := apierr.Reason(err); r == "REGION_EXHAUSTED" || r == "SOLD_OUT" {
				break
			}
			if err != nil {
				t.Fatalf("%s: buyer %d: %v", name, i, err)
			}
			n++
		}
	}
	return n
}

// TestFalseFlagsAreCorrected writes false stock flags into etcd as its administrator (what a
// stolen root certificate, or an earlier bug, could leave): a drained and a sold-out flag on
// a SKU with stock, and a sold-out SKU's flags deleted. The coordinator leader sees each
// differ from the books and publishes the truth again within a few seconds.
func TestFalseFlagsAreCorrected(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, op, "stock", 10)
	createSale2(t, op, "gone", 2)
	for _, r := range d.Regions {
		rc := quotav1.NewRegionServiceClient(dial(t, r.Addr(), trust.Storefront))
		res, err := rc.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "gone", Sku: "phone", UserId: "u-" + r.R.Name(), Quantity: 1, RequestKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: res.GetReservation().GetHoldId(), PaymentId: "p-" + r.R.Name()}); err != nil {
			t.Fatal(err)
		}
	}
	flag := func(f fencing.Flag, sale string) bool {
		resp := etcdAs(t, d, etcdRoot(), "get", "--print-value-only", "/quota/flags/"+string(f)+"/"+sale+"|phone")
		return resp == "1"
	}
	waitFor(t, "gone's sold-out flag", 10*time.Second, func() bool { return flag(fencing.SoldOut, "gone") })
	for _, f := range []fencing.Flag{fencing.SoldOut, fencing.Drained} {
		if err := fencing.SetFlag(ctx, d.EtcdClient, f, "stock", "phone", true); err != nil {
			t.Fatal(err)
		}
		if err := fencing.SetFlag(ctx, d.EtcdClient, f, "gone", "phone", false); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	waitFor(t, "the flags true to the books again", 10*time.Second, func() bool {
		return !flag(fencing.SoldOut, "stock") && !flag(fencing.Drained, "stock") && flag(fencing.SoldOut, "gone") && flag(fencing.Drained, "gone")
	})
	t.Logf("false flags corrected in %s", time.Since(start).Round(10*time.Millisecond))
}

// TestDrainedFlagTheBooksContradict: a drained flag raised in etcd while the region has units
// available, with no coordinator to correct it, does not close the region's waiting room: the
// region checks the flag against its own books and does not believe it. The same flag on a
// sale with no unit at the region does close its room there, which shows the region has seen
// the flags.
func TestDrainedFlagTheBooksContradict(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	d := startDev(t, "us", "eu")
	createWaitingSale(t, d, "rush", 10, 1000, map[string]int64{"us": 1})
	createWaitingSale(t, d, "far", 10, 1000, map[string]int64{"eu": 1}) // nothing at us
	d.Coordinator.Close()                                               // nobody corrects the flags
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, sale := range []string{"rush", "far"} {
		if err := fencing.SetFlag(ctx, d.EtcdClient, fencing.Drained, sale, "phone", true); err != nil {
			t.Fatal(err)
		}
	}
	c := httpClient(t, trust.Storefront)
	us := edgeURL(d, "us")
	waitFor(t, "us closes far's room on the drained flag", 10*time.Second, func() bool {
		a := call(t, c, "POST", us+"/v1/sales/far/admissions", map[string]string{"user_id": "probe-" + randHex(t)})
		return a.errCode() == "SOLD_OUT"
	})
	a := admit(t, c, us, "rush", "buyer-1")
	if a.str("ticket") == "" {
		t.Fatalf("with 10 units available, a false drained flag closed the room: %d %v", a.code, a.body)
	}
}

// TestForeignBindingIsRemoved: a binding to a region that does not exist, written into etcd
// as its administrator, would turn its buyer away at every region; the coordinator leader
// removes it within seconds, and the buyer then reserves.
func TestForeignBindingIsRemoved(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, op, "s", 10)
	if _, err := fencing.Bind(ctx, d.EtcdClient, "s", "victim-1", "mars", fencing.NoLease); err != nil {
		t.Fatal(err)
	}
	if _, err := fencing.Bind(ctx, d.EtcdClient, "s", "bound-1", "eu", fencing.NoLease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the binding to mars removed", 10*time.Second, func() bool {
		_, ok, err := fencing.Bound(ctx, d.EtcdClient, "s", "victim-1")
		return err == nil && !ok
	})
	if region, ok, err := fencing.Bound(ctx, d.EtcdClient, "s", "bound-1"); err != nil || !ok || region != "eu" {
		t.Errorf("a true binding: %q, %v, %v; want it kept, eu", region, ok, err)
	}
	us := quotav1.NewRegionServiceClient(dial(t, d.Regions[0].Addr(), trust.Storefront))
	if _, err := us.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "s", Sku: "phone", UserId: "victim-1", Quantity: 1, RequestKey: "v"}); err != nil {
		t.Fatalf("victim-1 after the removal: %v", err)
	}
}

// TestMisdirectedParticipantCallIsRefused: the coordinator's calls for region us sent to eu's
// server (a false or stale leader address) are refused as a conflict naming both regions, and
// change nothing at eu; sent to us they are served.
func TestMisdirectedParticipantCallIsRefused(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	createSale2(t, op, "s", 10)
	creds, err := certs.ClientCreds(trust.Coordinator)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		want string
	}{{d.Regions[1].Addr(), "CONFLICT"}, {d.Regions[0].Addr(), ""}} {
		p, err := coordrpc.DialResolving("us", tc.addr, nil, creds)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = p.Status(ctx, "alloc-s-us")
		if got := apierr.Reason(err); got != tc.want || tc.want != "" && !strings.Contains(err.Error(), "meant for region us") {
			t.Errorf("a call for us at %s: %v (reason %q); want reason %q", tc.addr, err, got, tc.want)
		}
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	}
	auditOK(t, op, "s")
}
