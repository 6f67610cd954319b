package cluster_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/testnet"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

var buildOnce struct {
	sync.Once
	path string
	err  error
}

// quotadBinary builds cmd/quotad once per test process.
func quotadBinary(t *testing.T) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "quotad-bin")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.path = filepath.Join(dir, "quotad")
		out, err := exec.Command("go", "build", "-o", buildOnce.path, "github.com/quotaworks/quota/cmd/quotad").CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build quotad: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

type quotadProc struct {
	t       *testing.T
	args    []string
	cmd     *exec.Cmd
	base    int
	exited  chan struct{} // closed once cmd has been waited for; exitErr is then set
	exitErr error
}

// start runs quotad and waits until its coordinator leads. A quotad that exits first (a port
// taken, a database it cannot open) fails the test at once with how it ended; its own
// reason is on stderr just above.
func (p *quotadProc) start() {
	p.t.Helper()
	p.cmd = exec.Command(quotadBinary(p.t), p.args...)
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		p.exitErr = p.cmd.Wait()
		close(exited)
	}()
	conn := dial(p.t, "127.0.0.1:"+strconv.Itoa(p.base), trust.Operator)
	c := quotav1.NewCoordinatorServiceClient(conn)
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.GetSale(ctx, &quotav1.GetSaleRequest{SaleId: "probe"})
		cancel()
		if err != nil && isNotFoundErr(err) { // the coordinator leads and reads its ledger
			return
		}
		select {
		case <-exited:
			p.t.Fatalf("quotad dev exited before it served: %v", p.exitErr)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("quotad dev not ready after 90s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill9 kills quotad with SIGKILL and waits until it is gone. Idempotent.
func (p *quotadProc) kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// TestKill9MidLoadKeepsEveryAcknowledgedHold kills `quotad dev` with SIGKILL while buyers
// reserve and pay, restarts it on the same databases and etcd data, and checks that every
// hold whose Reserve was acknowledged is there, held or sold, and the audit is clean (so
// nothing was counted twice).
func TestKill9MidLoadKeepsEveryAcknowledgedHold(t *testing.T) {
	t.Parallel()                                // its own cluster, no time bound (newTestCluster)
	base := testnet.Base(t, 0, 1, 2, 3, 90, 91) // coordinator, three regions, etcd client and peer
	prefix := "quota_t_" + randHex(t)
	t.Cleanup(func() { dropDBs(t, prefix, []string{"us", "eu", "ap"}) })
	p := &quotadProc{t: t, base: base, args: []string{"dev", "--base-port", strconv.Itoa(base), "--data-dir", t.TempDir(),
		"--db-prefix", prefix, "--pg-url", testpg.AdminURL(), "--lease-ttl", "2s", "--log-level", "warn", "--certs-dir", certs.Dir()}}
	p.start()
	t.Cleanup(p.kill9)
	coord := quotav1.NewCoordinatorServiceClient(dial(t, "127.0.0.1:"+strconv.Itoa(base), trust.Operator))
	createSale(t, coord, "crash", 5000, 2, 10*time.Minute)
	var regions []loadgen.Region
	for i, name := range []string{"us", "eu", "ap"} {
		regions = append(regions, loadgen.Region{Name: name, Addr: "127.0.0.1:" + strconv.Itoa(base+1+i), Weight: 1})
	}
	type result struct {
		st  loadgen.Stats
		err error
	}
	done := make(chan result, 1)
	lctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	var granted atomic.Int64
	go func() {
		st, err := loadgen.Run(lctx, loadgen.Config{Creds: creds(t, trust.Storefront), Sale: "crash", SKU: "phone", Regions: regions, Buyers: 20000,
			Concurrency: 100, ConfirmRatio: 0.5, MaxDuration: 2 * time.Minute, Seed: 3,
			ProgressEvery: 50 * time.Millisecond, Progress: func(s loadgen.Stats) { granted.Store(s.Granted) }})
		done <- result{st, err}
	}()
	for deadline := time.Now().Add(60 * time.Second); granted.Load() < 500 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	p.kill9()                          // mid-load: buyers are still reserving and paying
	time.Sleep(300 * time.Millisecond) // let some calls fail against the dead process, as clients would see
	stopLoad()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Logf("before the kill: %d holds acknowledged, %d confirmed, %d failed calls", len(res.st.Holds), res.st.Confirmed, res.st.Failed)
	if len(res.st.Holds) == 0 {
		t.Fatal("no hold was acknowledged before the kill; the test proves nothing")
	}
	p.start()
	clients := map[string]quotav1.RegionServiceClient{}
	for _, r := range regions {
		clients[r.Name] = quotav1.NewRegionServiceClient(dial(t, r.Addr, trust.Storefront))
	}
	for id, region := range res.st.Holds {
		got, err := clients[region].GetReservation(context.Background(), &quotav1.GetReservationRequest{HoldId: id})
		if err != nil {
			t.Fatalf("acknowledged hold %s at %s: %v", id, region, err)
		}
		if s := got.GetReservation().GetState(); s != quotav1.HoldState_HOLD_STATE_HELD && s != quotav1.HoldState_HOLD_STATE_SOLD {
			t.Fatalf("acknowledged hold %s is %s", id, s)
		}
	}
	a := auditOK(t, coord, "crash")
	if a.GetSold() < res.st.Confirmed {
		t.Fatalf("sold %d < %d acknowledged confirms", a.GetSold(), res.st.Confirmed)
	}
	if a.GetHeld()+a.GetSold() < int64(len(res.st.Holds)) {
		t.Fatalf("held %d + sold %d < %d acknowledged holds", a.GetHeld(), a.GetSold(), len(res.st.Holds))
	}
}
