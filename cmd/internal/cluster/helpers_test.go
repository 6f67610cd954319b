package cluster_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// certs are the package's cluster certificates (CA, node, a client per role), made once:
// every test here runs in the secure default, mutual TLS with roles.
var certs *trust.Material

func TestMain(m *testing.M) { testcerts.Main(m, &certs) }

// creds are the transport credentials of a client acting as role.
func creds(t testing.TB, role trust.Role) credentials.TransportCredentials {
	t.Helper()
	c, err := certs.ClientCreds(role)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randHex(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func dropDBs(t *testing.T, prefix string, regions []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, role := range append([]string{"coordinator"}, regions...) {
		if err := pgutil.DropDatabase(ctx, testpg.AdminURL(), cluster.DBName(prefix, role)); err != nil {
			t.Logf("drop: %v", err)
		}
	}
}

// verify turns on the regions' expensive invariant checks when QUOTA_VERIFY=1 (make test).
func verify() bool { return os.Getenv("QUOTA_VERIFY") == "1" }

// testLogger keeps test output to warnings and errors.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func isNotFoundErr(err error) bool { return status.Code(err) == codes.NotFound }

func itoa(i int) string { return strconv.Itoa(i) }

// createSale2 creates a sale of one SKU split evenly over us and eu.
func createSale2(t *testing.T, c quotav1.CoordinatorServiceClient, sale string, total int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: total}},
		PerUserLimit: 5, HoldTtlMs: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale, Weights: []*quotav1.RegionWeight{
		{Region: "us", Weight: 1}, {Region: "eu", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
}
