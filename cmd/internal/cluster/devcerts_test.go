package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestDevRenewsAnExpiredNodeCertificate: quotad dev started on a certificates directory whose
// node.crt has expired makes it again from the same CA, and a client of that CA gets through
// the handshake; without the renewal every call would fail it.
func TestDevRenewsAnExpiredNodeCertificate(t *testing.T) {
	dir := t.TempDir()
	if _, err := trust.EnsureDev(dir, trust.DevHosts); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.EnsureDevEtcd(dir, []string{"us"}); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateNode(dir, trust.DevHosts, true, trust.ValidFor(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := "quota_t_" + randHex(t)
	d, err := cluster.StartDev(ctx, cluster.DevConfig{Regions: []string{"us"}, PGURL: testpg.AdminURL(), DBPrefix: prefix,
		DataDir: t.TempDir(), Host: "127.0.0.1", LeaseTTL: 2 * time.Second, Logger: testLogger(), CertsDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		dropDBs(t, prefix, []string{"us"})
	})
	if len(d.CertsMade) != 2 || d.CertsMade[0] != trust.NodeCert {
		t.Errorf("made %v; want the node pair only", d.CertsMade)
	}
	m, err := trust.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	conn := testcerts.Dial(t, m, d.Regions[0].Addr(), trust.Auditor)
	_, err = quotav1.NewRegionServiceClient(conn).GetStock(ctx, &quotav1.GetStockRequest{SaleId: "none"})
	if c := status.Code(err); c != codes.OK && c != codes.NotFound {
		t.Fatalf("a call after the renewal: %v; want an answer (NotFound: no such sale)", err)
	}
}
