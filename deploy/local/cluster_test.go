// Package local_test runs deploy/local/cluster for real: a 3-member etcd, regions us, eu and
// ap (each with a standby) and two coordinators as separate processes on loopback, then kills
// leaders (a coordinator, an etcd member, a region under load) and checks the cluster keeps
// working.
package local_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/internal/etcdattack"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	"google.golang.org/grpc/credentials"
)

var processes = []string{"etcd1", "etcd2", "etcd3", "region-us", "region-eu", "region-ap",
	"region-us-2", "region-eu-2", "region-ap-2", "coordinator1", "coordinator2"}

// edges are the script's storefront edges, two per region sharing its storefront address.
var edges = []string{"edge-us", "edge-us-2", "edge-eu", "edge-eu-2", "edge-ap", "edge-ap-2"}

// moreEdges are the third and fourth edges of each region with QUOTA_CLUSTER_EDGES=4.
var moreEdges = []string{"edge-us-3", "edge-us-4", "edge-eu-3", "edge-eu-4", "edge-ap-3", "edge-ap-4"}

// portOffsets are the ports the script uses, relative to QUOTA_CLUSTER_BASE_PORT: gRPC, the
// regions' storefront addresses (their edges'), the region processes' own HTTP listeners
// (their gRPC port + 1100), etcd's client and peer ports.
var portOffsets = []int{0, 1, 2, 3, 10, 11, 12, 13, 1001, 1002, 1003, 1101, 1102, 1103, 1111, 1112, 1113, 181, 182, 183, 191, 192, 193,
	201, 202, 203, 204, 211, 212, 213, 214, 301, 302, 303, 304, 311, 312, 313, 314,
	401, 402, 403, 410, 411, 412, 413, 414, 415, 416, 417, 418, 422, 423, 432, 433, 442, 443} // the last row: up --wan's

// binDir holds quotad and quotactl for every cluster of this test binary: each `up` builds
// into it, and once the first has linked them go build finds them up to date (about 1.5 s
// instead of some 20 s of linking per test). The tests of this package run one at a time.
var binDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "quota-local-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy/local tests:", err)
		os.Exit(1)
	}
	binDir = d
	code := m.Run()
	if err := os.RemoveAll(d); err != nil {
		fmt.Fprintln(os.Stderr, "deploy/local tests:", err)
		code = 1
	}
	os.Exit(code)
}

type localCluster struct {
	t      *testing.T
	script string
	root   string
	dir    string
	bin    string
	base   int
	prefix string
	pgURL  string
	env    []string
	purged bool // the test ran `down --purge` itself
}

// newLocalCluster prepares a cluster (not started) in a temporary directory, on a free base
// port, with its own databases (quota_t_<hex>_<tag>_*), and runs `down --purge` when the test
// ends unless the test did. env adds settings (QUOTA_CLUSTER_LEASE_TTL=2s, ...); the caller's
// own QUOTA_* variables are dropped.
func newLocalCluster(t *testing.T, tag string, env ...string) *localCluster {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	c := &localCluster{t: t, root: root, script: filepath.Join(root, "deploy", "local", "cluster"),
		dir: t.TempDir(), bin: binDir, base: testnet.Base(t, portOffsets...), prefix: "quota_t_" + hex.EncodeToString(rnd[:]) + "_" + tag,
		pgURL: testpg.AdminURL()}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUOTA_") { // no QUOTA_COORDINATOR, QUOTA_OUTPUT, QUOTA_CLUSTER_… from the caller
			c.env = append(c.env, kv)
		}
	}
	// Storefront edges only for the tests that ask for them (QUOTA_CLUSTER_EDGES=2): the others
	// reach region processes' own listeners, and six fewer processes start faster on two cores.
	// Of a key given twice, the last value counts (os/exec).
	c.env = append(c.env, "QUOTA_CLUSTER_DIR="+c.dir, "QUOTA_CLUSTER_BIN="+c.bin, "QUOTA_CLUSTER_EDGES=0",
		"QUOTA_CLUSTER_BASE_PORT="+strconv.Itoa(c.base), "QUOTA_CLUSTER_DB_PREFIX="+c.prefix, "QUOTA_CLUSTER_PG_URL="+c.pgURL)
	c.env = append(c.env, env...)
	t.Logf("cluster dir %s, base port %d, databases %s_*", c.dir, c.base, c.prefix)
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		if !c.purged {
			if out, err := c.run(2*time.Minute, c.script, "down", "--purge"); err != nil {
				t.Errorf("cleanup: cluster down --purge: %v\n%s", err, out)
			}
		}
	})
	return c
}

// as is c for a subtest: the same cluster, its helpers reporting to t. The cluster's
// cleanup (logs on failure, down --purge) stays with the test that made it.
func (c *localCluster) as(t *testing.T) *localCluster {
	cc := *c
	cc.t = t
	return &cc
}

func (c *localCluster) addr(offset int) string { return "127.0.0.1:" + strconv.Itoa(c.base+offset) }

// cluster runs the script; it fails the test when the script fails.
func (c *localCluster) cluster(timeout time.Duration, args ...string) string {
	c.t.Helper()
	out, err := c.run(timeout, c.script, args...)
	if err != nil {
		c.t.Fatalf("cluster %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (c *localCluster) run(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.root
	cmd.Env = c.env
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (timeout %s)", err, timeout)
	}
	return out.String(), err
}

// quotactl runs bin/quotactl against the coordinator at addr.
func (c *localCluster) quotactl(addr string, args ...string) (string, error) {
	args = append([]string{"--coordinator", addr, "--timeout", "5s", "--certs-dir", c.certsDir()}, args...)
	return c.run(20*time.Second, filepath.Join(c.bin, "quotactl"), args...)
}

// noPasswordsOnCommandLines checks that no running process of the cluster has a database
// password on its command line (what ps shows): they read them from the cluster's passfile.
func (c *localCluster) noPasswordsOnCommandLines() {
	c.t.Helper()
	pids, err := filepath.Glob(filepath.Join(c.dir, "*.pid"))
	if err != nil || len(pids) == 0 {
		c.t.Fatalf("pid files in %s: %v, %v", c.dir, pids, err)
	}
	for _, f := range pids {
		pid, err := os.ReadFile(f)
		if err != nil {
			c.t.Fatal(err)
		}
		cmdline, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/cmdline")
		if err != nil {
			continue // not running
		}
		if line := strings.ReplaceAll(string(cmdline), "\x00", " "); strings.Contains(line, ":quota@") || strings.Contains(line, ":quota_reader@") {
			c.t.Errorf("%s: a password on the command line: %s", filepath.Base(f), line)
		}
	}
}

// certsDir is where the cluster script keeps the cluster's certificates.
func (c *localCluster) certsDir() string { return filepath.Join(c.dir, "certs") }

// creds are the transport credentials of a client acting as role, from the cluster's
// certificates (made by the script's up).
func (c *localCluster) creds(role trust.Role) credentials.TransportCredentials {
	c.t.Helper()
	m, err := trust.Load(c.certsDir())
	if err != nil {
		c.t.Fatal(err)
	}
	tc, err := m.ClientCreds(role)
	if err != nil {
		c.t.Fatal(err)
	}
	return tc
}

// eventually retries f until it succeeds or within passes, and says how long it took.
func (c *localCluster) eventually(within time.Duration, what string, f func() error) time.Duration {
	c.t.Helper()
	start := time.Now()
	for {
		err := f()
		if err == nil {
			took := time.Since(start)
			c.t.Logf("%s: after %s", what, took.Round(10*time.Millisecond))
			return took
		}
		if time.Since(start) > within {
			c.t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// status parses `cluster status`: process name → its line's fields after the name.
func (c *localCluster) status() map[string]string {
	c.t.Helper()
	out := c.cluster(60*time.Second, "status") // a few etcdctl calls per process: slow on a loaded machine
	st := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			st[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for _, p := range processes {
		if _, ok := st[p]; !ok {
			c.t.Fatalf("cluster status names no %s:\n%s", p, out)
		}
	}
	return st
}

func (c *localCluster) wantState(st map[string]string, want string, names ...string) {
	c.t.Helper()
	for _, n := range names {
		if !strings.HasPrefix(st[n], want+" ") {
			c.t.Errorf("%s: status %q, want %s", n, st[n], want)
		}
	}
}

type transferJSON struct {
	ID    string `json:"transfer_id"`
	State string `json:"state"`
}

// transfer asks the coordinator at addr to move units and wants the transfer posted.
func (c *localCluster) transfer(addr, from, to string, units int, requestID string) error {
	out, err := c.quotactl(addr, "transfer", "--sale", "t1", "--sku", "phone", "--from", from, "--to", to,
		"--units", strconv.Itoa(units), "--request-key", requestID, "--wait", "5s", "-o", "json")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	var tr transferJSON
	if err := json.Unmarshal([]byte(out), &tr); err != nil {
		return fmt.Errorf("transfer output %q: %v", out, err)
	}
	if tr.State != "posted" {
		return fmt.Errorf("transfer %s: state %s, want posted", tr.ID, tr.State)
	}
	return nil
}

// reserve reserves one phone at us, through the region list of the coordinator at addr.
func (c *localCluster) reserve(addr, user, key string) error {
	out, err := c.quotactl(addr, "reserve", "--region", "us", "--sale", "t1", "--sku", "phone", "--user", user, "--request-key", key, "-o", "json")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	var h struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &h); err != nil || h.State != "held" {
		return fmt.Errorf("reserve: %s (%v)", out, err)
	}
	return nil
}

func (c *localCluster) audit(addr string) {
	c.t.Helper()
	if out, err := c.quotactl(addr, "audit", "--sale", "t1"); err != nil {
		c.t.Fatalf("audit at %s: %v\n%s", addr, err, out)
	}
}

// dumpLogs prints the end of every process's log.
func (c *localCluster) dumpLogs() {
	for _, p := range append(append(processes[:len(processes):len(processes)], edges...), moreEdges...) {
		b, err := os.ReadFile(filepath.Join(c.dir, p+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		c.t.Logf("--- %s.log (end)\n%s", p, strings.Join(lines, "\n"))
	}
}

func (c *localCluster) databases() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.pgURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY datname", c.prefix+"_")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// TestLocalCluster runs the script's whole life on one cluster with storefront edges: `up` and
// `status`; kill -9 of storefront edges under a flash sale (localEdgesDieFreely); leaders and
// an etcd member killed, paused and restarted (localLeadersDie); and `down --purge`. The
// edges' test runs first: it needs coordinator1 leading, which the second one ends. One `up`
// serves both.
func TestLocalCluster(t *testing.T) {
	started := time.Now()
	c := newLocalCluster(t, "cl", "QUOTA_CLUSTER_EDGES=2")

	// The first build of cmd/... may compile etcd and gRPC from nothing: allow for it.
	up := time.Now()
	out := c.cluster(5*time.Minute, "up")
	t.Logf("cluster up: %s\n%s", time.Since(up).Round(time.Millisecond), out)
	st := c.status()
	c.wantState(st, "running", processes...)
	c.wantState(st, "running", edges...)
	if !strings.Contains(st["edge-us"], "storefront edge of us") || !strings.Contains(st["edge-us"], c.addr(1001)) {
		t.Errorf("status of edge-us: %q, want the storefront edge of us at %s", st["edge-us"], c.addr(1001))
	}
	if !strings.Contains(st["coordinator1"], "leader") || !strings.Contains(st["coordinator2"], "standby") {
		t.Fatalf("want coordinator1 leading and coordinator2 standing by:\n%s %s\n%s %s",
			"coordinator1", st["coordinator1"], "coordinator2", st["coordinator2"])
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("edges_die_freely", func(t *testing.T) { localEdgesDieFreely(t, c.as(t)) })
	t.Run("leaders_die", func(t *testing.T) { localLeadersDie(t, c.as(t)) })
	if t.Failed() {
		t.FailNow()
	}

	// down --purge stops everything, removes the files and drops the databases.
	out = c.cluster(2*time.Minute, "down", "--purge")
	c.purged = true
	t.Logf("cluster down --purge:\n%s", out)
	if _, err := os.Stat(filepath.Join(c.dir, "etcd1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after down --purge, %s/etcd1: %v, want it gone", c.dir, err)
	}
	for _, p := range []int{0, 1, 10, 11, 181} {
		if conn, err := net.DialTimeout("tcp", c.addr(p), time.Second); err == nil {
			conn.Close()
			t.Errorf("after down --purge, something still listens on %s", c.addr(p))
		}
	}
	if dbs, err := c.databases(); err != nil || len(dbs) != 0 {
		t.Errorf("after down --purge, databases %v (%v), want none", dbs, err)
	}
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}

// localLeadersDie: a sale and a reserve at us; etcd refuses attackers' writes; the standby
// coordinator refuses a transfer; the leading coordinator is killed and the standby takes over
// within 15 s; an etcd member is killed and the rest go on; a region leader and a standby are
// paused and resumed; the killed ones restart, coordinator1 as standby.
func localLeadersDie(t *testing.T, c *localCluster) {
	c.noPasswordsOnCommandLines()
	c1, c2 := c.addr(0), c.addr(10)
	if out, err := c.quotactl(c1, "sale", "create", "--sale", "t1", "--sku", "phone=100", "--allocate", "us=1,eu=1,ap=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	if err := c.reserve(c1, "u1", "k1"); err != nil {
		t.Fatal(err)
	}
	c.etcdRefusesAttackers("t1")
	// The standby refuses writes.
	if err := c.transfer(c2, "us", "eu", 1, "t1-standby"); err == nil || !strings.Contains(err.Error(), "NOT_LEADER") {
		t.Fatalf("transfer at the standby: %v, want NOT_LEADER", err)
	}

	// The leading coordinator dies: the standby takes over once its lease expires.
	c.cluster(30*time.Second, "kill", "coordinator1")
	took := c.eventually(20*time.Second, "coordinator2 posts a transfer after coordinator1 was killed", func() error {
		return c.transfer(c2, "us", "eu", 5, "t1-move-1")
	})
	if took > 15*time.Second {
		t.Errorf("coordinator2 took %s to take over, want at most 15s (lease 5s)", took)
	}
	c.audit(c2)
	st := c.status()
	c.wantState(st, "stopped", "coordinator1")
	if !strings.Contains(st["coordinator2"], "leader") {
		t.Errorf("coordinator2: %q, want leader", st["coordinator2"])
	}

	// An etcd member dies: two of three are a quorum, so regions and coordinator go on.
	c.cluster(30*time.Second, "kill", "etcd1")
	c.eventually(15*time.Second, "reserve at us with etcd1 killed", func() error { return c.reserve(c2, "u2", "k2") })
	c.eventually(15*time.Second, "transfer with etcd1 killed", func() error { return c.transfer(c2, "eu", "ap", 2, "t1-move-2") })
	c.audit(c2)
	st = c.status()
	c.wantState(st, "stopped", "etcd1", "coordinator1")
	c.wantState(st, "running", "etcd2", "etcd3", "region-us", "region-eu", "region-ap", "coordinator2")

	// Pause and resume a leader and a standby. A paused process that does not lead is not
	// called a standby: it could take over from nobody.
	for _, p := range []string{"region-eu", "region-ap-2"} {
		c.cluster(30*time.Second, "pause", p)
	}
	st = c.status()
	c.wantState(st, "paused", "region-eu", "region-ap-2")
	if !strings.HasSuffix(st["region-ap-2"], "not leading; paused") {
		t.Errorf("paused standby region-ap-2: %q, want \"not leading; paused\"", st["region-ap-2"])
	}
	for _, p := range []string{"region-eu", "region-ap-2"} {
		c.cluster(30*time.Second, "resume", p)
	}

	// Restart the killed ones: etcd1 rejoins from its data, coordinator1 stands by.
	c.cluster(time.Minute, "start", "etcd1")
	c.cluster(time.Minute, "start", "coordinator1")
	st = c.status()
	c.wantState(st, "running", processes...)
	if !strings.Contains(st["coordinator1"], "standby") || !strings.Contains(st["coordinator2"], "leader") {
		t.Errorf("after the restart: coordinator1 %q, coordinator2 %q; want standby and leader", st["coordinator1"], st["coordinator2"])
	}
	c.eventually(15*time.Second, "reserve at us after the restarts", func() error { return c.reserve(c2, "u3", "k3") })
	c.audit(c2)
}

// etcdRefusesAttackers replays with etcdctl the writes that hurt a sale while etcd trusted
// anyone, with no certificate and with each client certificate of the cluster's CA: each is
// refused by etcd's authorization, and etcd holds what it held.
func (c *localCluster) etcdRefusesAttackers(sale string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ep, ca := "https://"+c.addr(181), filepath.Join(c.certsDir(), trust.CACert)
	root := etcdattack.Identity{Name: "root", Cert: filepath.Join(c.certsDir(), trust.EtcdCert(trust.EtcdRoot)),
		Key: filepath.Join(c.certsDir(), trust.EtcdKey(trust.EtcdRoot))}
	asRoot := func(args ...string) string {
		out, err := etcdattack.Run(ctx, ep, ca, root, args...)
		if err != nil {
			c.t.Fatalf("etcdctl %v as root: %v: %s", args, err, out)
		}
		return out
	}
	leaderKey := strings.TrimSpace(asRoot("get", "--prefix", "--keys-only", "--sort-by=CREATE", "--limit=1", "/quota/election/region/eu/"))
	before := asRoot("get", "--prefix", "/quota/")
	results, err := etcdattack.Replay(ctx, ep, ca, etcdattack.Identities(c.certsDir()),
		etcdattack.Attempts(sale, "phone", "u1", "victim-1", "eu", leaderKey))
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range results {
		if !r.Refused || r.Identity != "no certificate" && !r.Denied && !r.Handshake {
			c.t.Errorf("etcd as %s: %s: not refused by etcd's authorization or at the handshake: %s", r.Identity, r.What, r.Output)
		}
	}
	if after := asRoot("get", "--prefix", "/quota/"); after != before {
		c.t.Fatalf("etcd changed under the attacks:\nbefore %s\nafter  %s", before, after)
	}
}
