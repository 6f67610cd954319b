package local_test

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// coordinatorCall runs quotactl at coordinator1, then at coordinator2 when the first fails
// (the same request id makes a repeated transfer the same transfer).
func (r *chaosRun) coordinatorCall(args ...string) (string, error) {
	out, err := r.c.quotactl(r.c.addr(0), args...)
	if err == nil {
		return out, nil
	}
	out2, err2 := r.c.quotactl(r.c.addr(10), args...)
	if err2 == nil {
		return out2, nil
	}
	return out + out2, fmt.Errorf("at both coordinators: %w; %w", err, err2)
}

// transfers moves phones between regions every few seconds, and every fourth time rebalances.
func (r *chaosRun) transfers(ctx context.Context) {
	rng := mrand.New(mrand.NewPCG(r.seed, 77))
	regions := []string{"us", "eu", "ap"}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(1500+rng.IntN(2000)) * time.Millisecond):
		}
		if i%4 == 3 {
			_, err := r.coordinatorCall("rebalance", "--sale", chaosSale, "--sku", "phone", "--min-units", "1",
				"--window", "20s", "--horizon", "20s", "--request-key", fmt.Sprintf("chaos-rb-%d", i), "-o", "json")
			r.ops.mu.Lock()
			r.ops.rebalances++
			if err == nil {
				r.ops.rebalancesAcked++
			}
			r.ops.mu.Unlock()
			continue
		}
		from := rng.IntN(3)
		to := (from + 1 + rng.IntN(2)) % 3
		_, err := r.coordinatorCall("transfer", "--sale", chaosSale, "--sku", "phone", "--from", regions[from], "--to", regions[to],
			"--units", strconv.Itoa(1+rng.IntN(40)), "--request-key", fmt.Sprintf("chaos-tr-%d", i), "--wait", "5s", "-o", "json")
		r.ops.mu.Lock()
		r.ops.transfers++
		if err == nil {
			r.ops.transfersAcked++
		}
		r.ops.mu.Unlock()
	}
}

// heal: the nemesis has undone its faults; every link is healed again (in case), every process
// runs (`up` starts what is not running and waits for the leaders), then the workers ask
// again what they never got an answer to.
func (r *chaosRun) heal() {
	for _, e := range r.nem.errs {
		r.t.Errorf("nemesis: %s", e)
	}
	for name := range r.links.proxies {
		if err := r.links.heal(name); err != nil {
			r.t.Error(err)
		}
	}
	out := r.c.cluster(5*time.Minute, "up")
	r.t.Logf("after the chaos, cluster up:\n%s", out)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range r.workers {
		wg.Go(func() { w.drain(ctx) })
	}
	wg.Wait()
}

type chaosTransfer struct {
	ID       string `json:"transfer_id"`
	State    string `json:"state"`
	Stranded bool   `json:"stranded"`
	Reason   string `json:"reason"`
}

// settle resolves every unfinished transfer (by its destination's record) and counts the
// transfers by how they ended.
func (r *chaosRun) settle() {
	deadline := time.Now().Add(90 * time.Second)
	var list struct {
		Transfers []chaosTransfer `json:"transfers"`
	}
	for {
		out, err := r.coordinatorCall("transfers", "list", "--sale", chaosSale, "-o", "json")
		if err != nil {
			r.t.Fatalf("transfers list: %v\n%s", err, out)
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			r.t.Fatalf("transfers list: %v\n%s", err, out)
		}
		unfinished := 0
		for _, tr := range list.Transfers {
			if tr.State != "posted" && tr.State != "voided" {
				unfinished++
				r.coordinatorCall("transfers", "resolve", tr.ID, "-o", "json") //nolint:errcheck // listed again
			}
		}
		if unfinished == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	for _, tr := range list.Transfers {
		switch {
		case tr.State == "posted":
			r.ops.posted++
		case tr.State == "voided":
			r.ops.voided++
		case tr.Stranded && tr.Reason != "":
			r.ops.stranded++
			r.t.Logf("transfer %s stays %s, stranded: %s", tr.ID, tr.State, tr.Reason)
		default:
			r.t.Errorf("transfer %s: %s, neither finished nor stranded with a reason (%q)", tr.ID, tr.State, tr.Reason)
		}
	}
}

// check runs the final checks and returns the number of violations.
func (r *chaosRun) check() int {
	violations := r.checkAudit()
	violations += r.checkLoadHolds()
	for _, w := range r.workers {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		n, bad := w.checkHolds(ctx)
		cancel()
		r.ops.holdsChecked += n
		for _, b := range bad {
			r.t.Errorf("VIOLATION I6: %s", b)
		}
		violations += len(bad)
	}
	violations += r.checkLinearizable()
	return violations
}
