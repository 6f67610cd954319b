package local_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
)

// upgradeFrom is the release TestLocalUpgrade upgrades from unless QUOTA_UPGRADE_FROM names
// another commit: one whose schemas and deploy/local/cluster command lines this tree's
// binaries and script still accept.
const upgradeFrom = "ced15603d115bdc2fac86b96c38a96aaf603547f"

// buildAt builds quotad and quotactl of commit rev of the repository at root into dir: the
// commit's tree is exported (git archive) into a temporary directory and built there.
func buildAt(t *testing.T, root, rev, dir string) {
	t.Helper()
	src := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", rev, err, out)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "./cmd/quotad", "./cmd/quotactl")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build at %s: %v\n%s", rev, err, out)
	}
}

// TestLocalUpgrade is a rolling upgrade under load: deploy/local runs the previous release's
// binaries (upgradeFrom, or QUOTA_UPGRADE_FROM), then each process is stopped and started
// again on this tree's binaries, one at a time (the etcd members, each region's standby and
// then its leader, which hands over to the upgraded standby, then the standby coordinator and
// the leader) while buyers reserve and pay at two regions. No acknowledged hold is lost, the
// audit is clean, every process runs the new binary and quotactl status exits 0. It builds
// the old binaries, so it runs only with QUOTA_UPGRADE=1.
func TestLocalUpgrade(t *testing.T) {
	if os.Getenv("QUOTA_UPGRADE") != "1" {
		t.Skip("set QUOTA_UPGRADE=1: builds the previous release's binaries (minutes)")
	}
	started := time.Now()
	from := upgradeFrom
	if v := os.Getenv("QUOTA_UPGRADE_FROM"); v != "" {
		from = v
	}
	// no storefront edges: the previous release has no quotad edge --reuse-port
	c := newLocalCluster(t, "up", "QUOTA_CLUSTER_LEASE_TTL=2s", "QUOTA_CLUSTER_BUILD=0", "QUOTA_CLUSTER_EDGES=0")
	c.bin = t.TempDir() // the old binaries: not the package's shared directory (TestMain)
	c.env = append(c.env, "QUOTA_CLUSTER_BIN="+c.bin)
	newBin := t.TempDir()
	buildAt(t, c.root, from, c.bin)
	build := exec.Command("go", "build", "-o", newBin+"/", "./cmd/quotad", "./cmd/quotactl")
	build.Dir = c.root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built %s and this tree: %s", from[:12], time.Since(started).Round(time.Second))
	c.cluster(5*time.Minute, "up")
	coord := c.addr(0)
	if out, err := c.quotactl(coord, "sale", "create", "--sale", "u", "--sku", "phone=100000", "--per-user-limit", "2",
		"--hold-ttl", "10m", "--allocate", "us=1,eu=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	load := c.startLoad(ctx, loadgen.Config{Sale: "u", SKU: "phone",
		Regions: []loadgen.Region{{Name: "us", Addr: c.addr(1), Weight: 1}, {Name: "eu", Addr: c.addr(2), Weight: 1}},
		Buyers:  1_000_000, Concurrency: 32, ConfirmRatio: 0.5, UserPrefix: "up-", MaxDuration: 4 * time.Minute, Seed: 7,
		ProgressEvery: 5 * time.Second})
	time.Sleep(3 * time.Second)
	upgradeStart := time.Now()
	c.rollingUpgrade(newBin)
	t.Logf("rolling upgrade of %d processes: %s", len(processes), time.Since(upgradeStart).Round(time.Second))
	time.Sleep(3 * time.Second) // the load runs on the new binaries too
	st := load.stop(t)
	newC := *c
	newC.bin = newBin
	newC.checkUpgradedHolds(st)
	newC.checkUpgraded(newBin)
	t.Logf("TestLocalUpgrade wall time %s", time.Since(started).Round(time.Second))
}

// rollingUpgrade stops each process and starts it again on newBin, one at a time: the etcd
// members, then per region the standby and then the leader (its SIGTERM resigns, and the
// upgraded standby takes over), then the standby coordinator and the leader.
func (c *localCluster) rollingUpgrade(newBin string) {
	c.t.Helper()
	up := *c
	up.env = append(slices.Clone(c.env), "QUOTA_CLUSTER_BIN="+newBin)
	order := []string{"etcd1", "etcd2", "etcd3",
		"region-us-2", "region-us", "region-eu-2", "region-eu", "region-ap-2", "region-ap", "coordinator2", "coordinator1"}
	for _, name := range order {
		step := time.Now()
		up.cluster(time.Minute, "stop", name)
		up.cluster(2*time.Minute, "start", name)
		if strings.HasPrefix(name, "etcd") { // the next member stops only once this one is back in the quorum
			up.eventually(60*time.Second, name+" healthy", func() error { return c.etcdHealthy(name) })
		}
		c.t.Logf("upgraded %s in %s", name, time.Since(step).Round(100*time.Millisecond))
	}
}

// checkUpgradedHolds finds every acknowledged hold, held or sold, at its region's leader,
// and runs the audit (with c.bin's quotactl).
func (c *localCluster) checkUpgradedHolds(st loadgen.Stats) {
	c.t.Helper()
	c.lookupHolds(st.Holds).check(c.t, st.Confirmed)
	if s := c.auditSale(c.t, "u"); s.Held+s.Sold < int64(len(st.Holds)) {
		c.t.Errorf("audit %+v: fewer held and sold than the %d acknowledged holds", s, len(st.Holds))
	}
}

// checkUpgraded: every process runs newBin's quotad, and quotactl status finds nothing that
// needs a person.
func (c *localCluster) checkUpgraded(newBin string) {
	c.t.Helper()
	for _, p := range processes {
		pid, err := os.ReadFile(filepath.Join(c.dir, p+".pid"))
		if err != nil {
			c.t.Errorf("%s: %v", p, err)
			continue
		}
		exe, err := os.Readlink("/proc/" + strings.TrimSpace(string(pid)) + "/exe")
		if err != nil || exe != filepath.Join(newBin, "quotad") {
			c.t.Errorf("%s runs %q (%v), want %s", p, exe, err, filepath.Join(newBin, "quotad"))
		}
	}
	c.waitStatus(60*time.Second, "the upgraded cluster: status exit 0", 0, noProblems)
}

// etcdHealthy asks etcd member name (etcd1..3) for GET /health, as the etcd root identity.
func (c *localCluster) etcdHealthy(name string) error {
	m, err := trust.Load(c.certsDir())
	if err != nil {
		return err
	}
	cfg, err := m.EtcdClientConfig(trust.EtcdRoot)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + c.addr(180+int(name[len(name)-1]-'0')) + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	if !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("%s: /health %d %s", name, resp.StatusCode, body)
	}
	return nil
}
