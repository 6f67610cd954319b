package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testcerts"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	"google.golang.org/grpc"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
)

// run executes quotactl with args and returns its standard output and error.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := rootCmd(&out)
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--certs-dir") || a == "--insecure" }) {
		args = append([]string{"--certs-dir=" + certs.Dir()}, args...)
	}
	root.SetArgs(args)
	root.SetErr(&out)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// mustRun is run that fails the test on an error, printing the output.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, describe(err), out)
	}
	return out
}

// certs are the package's cluster certificates, made once: the CLI's tests run in the
// secure default, and run passes --certs-dir unless a test names its own.
var certs *trust.Material

func TestMain(m *testing.M) { testcerts.Main(m, &certs) }

// startDev starts an all-in-one cluster on free ports with fresh databases, stopped and
// dropped at the end of the test.
func startDev(t *testing.T, regions ...string) *cluster.Dev {
	t.Helper()
	return startDevWith(t, func(*cluster.DevConfig) {}, regions...)
}

// startDevWith is startDev with the configuration changed by tune first.
func startDevWith(t *testing.T, tune func(*cluster.DevConfig), regions ...string) *cluster.Dev {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "quota_t_cli_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := cluster.DevConfig{Regions: regions, PGURL: testpg.AdminURL(), DBPrefix: prefix,
		DataDir: t.TempDir(), Host: "127.0.0.1", LeaseTTL: 2 * time.Second, Logger: slog.New(slog.DiscardHandler), CertsDir: certs.Dir()}
	tune(&cfg)
	d, err := cluster.StartDev(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		for _, role := range append([]string{"coordinator"}, regions...) {
			_ = pgutil.DropDatabase(context.Background(), testpg.AdminURL(), cluster.DBName(prefix, role))
		}
	})
	return d
}

// TestAuditReportsABreachWithEvidence: the CLI's audit exits 0 on a clean sale; after the
// stored data of a region is tampered with (books still balanced, one unit conjured), it
// exits 1 and names the broken invariant with its terms.
func TestAuditReportsABreachWithEvidence(t *testing.T) {
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	coord := "--coordinator=" + d.Coordinator.Addr()
	if out, err := run(t, coord, "sale", "create", "--sale", "s", "--sku", "phone=100", "--allocate", "us=1,eu=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	if out, err := run(t, coord, "audit", "--sale", "s", "-o", "json"); err != nil {
		t.Fatalf("clean audit: %v\n%s", err, out)
	}
	// Tamper with us's database: one more unit available and credited, balanced books (I3)
	// but a unit that the ledger never gave out (I1).
	db, err := pgutil.Open(ctx, d.DBURLs["us"], 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `UPDATE pools SET available = available + 1, credited_in = credited_in + 1 WHERE sale_id = 's'`); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, coord, "audit", "--sale", "s", "-o", "json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("audit of tampered data: err %v; want exit status 1\n%s", err, out)
	}
	var rep auditJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("audit -o json: %v\n%s", err, out)
	}
	if rep.OK || len(rep.Violations) == 0 || rep.Violations[0].Invariant != "I1" || rep.SKUs[0].Available != 101 {
		t.Fatalf("audit report %+v; want an I1 violation with 101 available against a total of 100", rep)
	}
	t.Logf("evidence: %s", rep.Violations[0].Detail)
}

// TestServersHaveReflectionAndHealth: grpcurl and ghz need server reflection; every server
// lists its services and the standard health service.
func TestServersHaveReflectionAndHealth(t *testing.T) {
	d := startDev(t, "us")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	want := map[string][]string{
		d.Coordinator.Addr(): {"quota.v1.CoordinatorService", "grpc.health.v1.Health"},
		d.Regions[0].Addr():  {"quota.v1.RegionService", "quota.v1.ParticipantService", "grpc.health.v1.Health"},
	}
	for addr, services := range want {
		creds, err := certs.ClientCreds(trust.Auditor) // reflection needs a certificate, of any role
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		stream, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, s := range resp.GetListServicesResponse().GetService() {
			have[s.GetName()] = true
		}
		for _, s := range services {
			if !have[s] {
				t.Errorf("%s does not list %s (lists %v)", addr, s, have)
			}
		}
		conn.Close()
	}
}
