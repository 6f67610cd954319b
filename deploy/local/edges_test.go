package local_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
)

// storefrontOf is region r's storefront address in the script: base+1001 for us, +1002 eu,
// +1003 ap, served by the region's two edges together (SO_REUSEPORT).
func (c *localCluster) storefrontOf(r string) string {
	i := map[string]int{"us": 1, "eu": 2, "ap": 3}[r]
	if i == 0 {
		c.t.Fatalf("storefrontOf: no region %q", r)
	}
	return "https://" + c.addr(1000+i)
}

// spreadTransport sends each request on the next of its transports, each with its own
// connections: a storefront with many connections, which the kernel spreads over the edges
// that share the address.
type spreadTransport struct {
	rts []http.RoundTripper
	n   atomic.Uint64
}

func (s *spreadTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return s.rts[s.n.Add(1)%uint64(len(s.rts))].RoundTrip(r)
}

// storefrontClient is a storefront's HTTP client (the cluster's storefront certificate) over
// n connections of its own.
func (c *localCluster) storefrontClient(n int, timeout time.Duration) *http.Client {
	c.t.Helper()
	m, err := trust.Load(c.certsDir())
	if err != nil {
		c.t.Fatal(err)
	}
	cfg, err := m.ClientConfig(trust.Storefront)
	if err != nil {
		c.t.Fatal(err)
	}
	s := &spreadTransport{}
	for range n {
		tr := &http.Transport{TLSClientConfig: cfg.Clone(), ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 1}
		c.t.Cleanup(tr.CloseIdleConnections)
		s.rts = append(s.rts, tr)
	}
	return &http.Client{Transport: s, Timeout: timeout}
}

// pidOf is the pid in process name's pid file.
func (c *localCluster) pidOf(name string) int {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, name+".pid"))
	if err != nil {
		c.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		c.t.Fatalf("%s.pid: %v", name, err)
	}
	return pid
}

// established counts the TCP connections process pid holds established on its local port
// (from /proc: its sockets' inodes, matched in /proc/net/tcp and tcp6).
func established(pid, port int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	suffix, n := fmt.Sprintf(":%04X", port), 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(line)
			if len(fs) >= 10 && fs[3] == "01" && strings.HasSuffix(fs[1], suffix) && inodes[fs[9]] {
				n++
			}
		}
	}
	return n, nil
}

// localEdgesDieFreely is kill -9 of storefront edges during a flash sale on real processes
// (TestLocalCluster's cluster, with edges): us's storefront address is served by edge-us and
// edge-us-2 together; a load of buyers (entering the waiting room, polling, reserving with
// their tickets, paying) goes to it over 16 connections, retrying what got no answer with the
// same request keys. While it runs, `cluster kill edge-us` (it serves some of the
// connections), start it again, then `cluster kill edge-us-2`. No buyer fails, every
// acknowledged hold is held or sold at the leader, every buyer holds at most the one unit of
// their one ticket (none admitted twice), and the audit is clean. TestLocalCluster has checked
// that status shows the six edges running, edge-us at base+1001.
func localEdgesDieFreely(t *testing.T, c *localCluster) {
	const (
		sale    = "edges"
		buyers  = 1200
		total   = 3000
		maxLive = 200
	)
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := c.quotactl(c.addr(0), "sale", "create", "--sale", sale, "--sku", "phone="+strconv.Itoa(total),
		"--per-user-limit", "2", "--hold-ttl", "10m", "--admit-rate", "400", "--ticket-ttl", "2m",
		"--max-live-tickets", strconv.Itoa(maxLive), "--allocate", "us=1,eu=1,ap=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}

	port := c.base + 1001
	hc := c.storefrontClient(16, 10*time.Second)
	load := c.startLoad(ctx, loadgen.Config{Sale: sale, SKU: "phone", Regions: []loadgen.Region{{Name: "us", Weight: 1}},
		HTTP: &loadgen.HTTPEdge{Client: hc, Bases: map[string]string{"us": c.storefrontOf("us")}}, Buyers: buyers,
		Concurrency: 48, Quantity: 1, Rate: 60, ConfirmRatio: 0.6, UserPrefix: "ed-",
		MaxDuration: 60 * time.Second, Seed: 7, ProgressEvery: 3 * time.Second})

	// killEdge kills one edge once it serves some of the storefront's connections.
	killEdge := func(name string) {
		t.Helper()
		pid := c.pidOf(name)
		c.eventually(10*time.Second, name+" serves storefront connections", func() error {
			n, err := established(pid, port)
			if err == nil && n == 0 {
				err = fmt.Errorf("%s (pid %d) holds no connection on :%d", name, pid, port)
			}
			if err == nil {
				t.Logf("%s holds %d storefront connections", name, n)
			}
			return err
		})
		killed := time.Now()
		c.cluster(30*time.Second, "kill", name)
		t.Logf("cluster kill %s: %s", name, time.Since(killed).Round(time.Millisecond))
	}
	load.running(t, 4*time.Second)
	killEdge("edge-us")
	load.running(t, 3*time.Second)
	c.cluster(time.Minute, "start", "edge-us")
	load.running(t, 2*time.Second)
	killEdge("edge-us-2")
	ls := load.wait(t, 90*time.Second)
	t.Logf("load through the edges: %d buyers, %d admitted, %d polls, %d holds, %d confirmed, %d failed, %d retries",
		ls.Buyers, ls.Admitted, ls.Polls, ls.Granted, ls.Confirmed, ls.Failed, ls.Retries)
	if ls.Failed != 0 || ls.Buyers != buyers || ls.Admitted != buyers || ls.Granted != buyers {
		t.Errorf("with edges killed: %d of %d buyers, %d admitted, %d granted, %d failed (first error %q); want every buyer admitted and granted, none failed",
			ls.Buyers, buyers, ls.Admitted, ls.Granted, ls.Failed, ls.FirstError)
	}

	// Every acknowledged hold is held or sold at the leader, every confirm a sale.
	c.lookupHolds(ls.Holds).check(t, ls.Confirmed)
	// No buyer was admitted twice: each holds the one unit of their one ticket.
	perUser, err := c.unitsPerUser(ctx, "us", sale)
	if err != nil {
		t.Fatal(err)
	}
	var units int64
	for u, q := range perUser {
		if q != 1 {
			t.Errorf("buyer %s holds %d units at us, want the 1 of their one ticket", u, q)
		}
		units += q
	}
	if int64(len(perUser)) > ls.Granted {
		t.Errorf("%d buyers hold units at us; the load was granted %d holds", len(perUser), ls.Granted)
	}
	s := c.auditSale(t, sale)
	if s.Held+s.Sold != units || s.Sold < ls.Confirmed {
		t.Errorf("audit held %d + sold %d, want the %d units the region's database holds, at least %d sold", s.Held, s.Sold, units, ls.Confirmed)
	}
	c.cluster(time.Minute, "start", "edge-us-2")
	c.wantState(c.status(), "running", edges...)
	t.Logf("total %s", time.Since(started).Round(time.Millisecond))
}
