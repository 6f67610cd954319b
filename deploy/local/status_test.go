package local_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// statusJSON is what the test reads of `quotactl status -o json`.
type statusJSON struct {
	OK          bool `json:"ok"`
	Coordinator struct {
		Leader     string   `json:"leader"`
		Candidates []string `json:"candidates"`
	} `json:"coordinator"`
	Regions []struct {
		Name      string `json:"name"`
		Leader    string `json:"leader"`
		Epoch     int64  `json:"epoch"`
		Database  string `json:"database"`
		Processes []struct {
			Address      string `json:"address"`
			Answered     bool   `json:"answered"`
			Leading      bool   `json:"leading"`
			RefreshAgeMs int64  `json:"refresh_age_ms"`
		} `json:"processes"`
	} `json:"regions"`
	Etcd []struct {
		Name    string `json:"name"`
		Healthy bool   `json:"healthy"`
	} `json:"etcd"`
	Transfers struct {
		Stranded int64 `json:"stranded"`
	} `json:"transfers"`
	Certificates []struct {
		Source string `json:"source"`
	} `json:"certificates"`
	Problems []string `json:"problems"`
}

// quotactlStatus runs `quotactl status -o json` at the coordinator and returns what it
// printed and its exit status (an error only when it could not run or printed no status).
func (c *localCluster) quotactlStatus() (statusJSON, int, error) {
	var st statusJSON
	out, err := c.quotactl(c.addr(0), "status", "-o", "json", "--timeout", "15s")
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return st, -1, err
	}
	if jerr := json.Unmarshal([]byte(out), &st); jerr != nil {
		return st, code, fmt.Errorf("quotactl status (exit %d): %v\n%s", code, jerr, out)
	}
	return st, code, nil
}

// waitStatus waits until quotactl status exits with want and its problems satisfy ok.
func (c *localCluster) waitStatus(within time.Duration, what string, want int, ok func([]string) error) statusJSON {
	c.t.Helper()
	var st statusJSON
	c.eventually(within, what, func() error {
		var code int
		var err error
		if st, code, err = c.quotactlStatus(); err != nil {
			return err
		}
		if code != want {
			return fmt.Errorf("exit %d, want %d; problems %q", code, want, st.Problems)
		}
		return ok(st.Problems)
	})
	return st
}

// problemLike accepts problems of which one starts with prefix and contains each of words.
func problemLike(prefix string, words ...string) func([]string) error {
	return func(ps []string) error {
		for _, p := range ps {
			if !strings.HasPrefix(p, prefix) {
				continue
			}
			all := true
			for _, w := range words {
				all = all && strings.Contains(p, w)
			}
			if all {
				return nil
			}
		}
		return fmt.Errorf("no problem %q… with %q among %q", prefix, words, ps)
	}
}

// eitherProblem accepts problems that a or b accepts.
func eitherProblem(a, b func([]string) error) func([]string) error {
	return func(ps []string) error {
		errA := a(ps)
		if errA == nil {
			return nil
		}
		if errB := b(ps); errB != nil {
			return fmt.Errorf("%v, and %v", errA, errB)
		}
		return nil
	}
}

func noProblems(ps []string) error {
	if len(ps) > 0 {
		return fmt.Errorf("problems %q", ps)
	}
	return nil
}

// localStatus is quotactl status against real processes (TestLocalRegionFaults's cluster,
// as `up` left it: a 2 s lease, QUOTA_STRAND_AFTER=2s): exit 0 and every region's leader and
// standby on a healthy cluster; exit 1 naming the fault for a paused etcd member, a killed
// region leader (while its lease lasts and after the standby took over: no standby left) and
// a stranded transfer; exit 0 again once each is mended. It touches etcd3, us and eu only.
func localStatus(t *testing.T, c *localCluster) {
	started := time.Now()
	st := c.waitStatus(60*time.Second, "healthy cluster: status exit 0", 0, noProblems)
	c.checkHealthy(st)

	c.cluster(30*time.Second, "pause", "etcd3")
	c.waitStatus(30*time.Second, "paused etcd3 reported", 1, problemLike("etcd member ", c.addr(183)+"): not healthy"))
	c.cluster(30*time.Second, "resume", "etcd3")
	c.waitStatus(60*time.Second, "etcd3 resumed: exit 0", 0, noProblems)

	c.cluster(30*time.Second, "kill", "region-us")
	// Reported at once: the killed leader by its address while its lease lasts or, once the
	// standby took over (a 2 s lease may end before the status is next gathered), no standby.
	c.waitStatus(30*time.Second, "killed region-us reported", 1, eitherProblem(problemLike("region us:", c.addr(1)), problemLike("region us:", "no standby")))
	c.waitStatus(30*time.Second, "region us without a standby reported", 1, problemLike("region us:", "no standby"))
	c.cluster(60*time.Second, "start", "region-us")
	c.waitStatus(60*time.Second, "region-us back as standby: exit 0", 0, noProblems)

	// The coordinators may still be settling after etcd's pause (NOT_LEADER), and coordinator2
	// may have taken the lead during it (a 2 s lease): ask each until one leads.
	var coord string
	c.eventually(30*time.Second, "sale created", func() error {
		var errs []string
		for _, addr := range []string{c.addr(0), c.addr(10)} {
			out, err := c.quotactl(addr, "sale", "create", "--sale", "st", "--sku", "phone=100")
			if err == nil || strings.Contains(out, "already exists") {
				coord = addr
				return nil
			}
			errs = append(errs, fmt.Sprintf("%s: %v\n%s", addr, err, out))
		}
		return fmt.Errorf("sale create: %s", strings.Join(errs, "; "))
	})
	c.cluster(30*time.Second, "kill", "region-eu")
	c.cluster(30*time.Second, "kill", "region-eu-2")
	if out, err := c.quotactl(coord, "transfer", "--sale", "st", "--sku", "phone", "--from", "unallocated", "--to", "eu",
		"--units", "10", "--wait", "1s", "--timeout", "20s"); err != nil {
		t.Fatalf("transfer to eu while it is down: %v\n%s", err, out)
	}
	st = c.waitStatus(60*time.Second, "stranded transfer reported", 1, problemLike("transfer ", "stranded", "-> eu"))
	if st.Transfers.Stranded != 1 {
		t.Errorf("stranded transfers %d, want 1", st.Transfers.Stranded)
	}
	c.cluster(60*time.Second, "start", "region-eu")
	c.cluster(60*time.Second, "start", "region-eu-2")
	c.waitStatus(60*time.Second, "eu back, the transfer finished: exit 0", 0, noProblems)
	t.Logf("status subtest wall time %s", time.Since(started).Round(time.Second))
}

// checkHealthy checks a healthy cluster's status: two coordinators, every region led with
// one standby and a single database, three healthy etcd members, certificates both from the
// directory and from servers' handshakes.
func (c *localCluster) checkHealthy(st statusJSON) {
	c.t.Helper()
	if !st.OK || st.Coordinator.Leader != c.addr(0) || len(st.Coordinator.Candidates) != 2 {
		c.t.Errorf("coordinators: ok %v leader %s candidates %v; want %s leading, 2", st.OK, st.Coordinator.Leader, st.Coordinator.Candidates, c.addr(0))
	}
	if len(st.Regions) != 3 {
		c.t.Fatalf("regions %+v, want 3", st.Regions)
	}
	for i, r := range st.Regions {
		if r.Leader != c.addr(1+i) || r.Epoch <= 0 || r.Database != "single" || len(r.Processes) != 2 {
			c.t.Errorf("region %s: %+v; want leader %s, an epoch, database single, 2 processes", r.Name, r, c.addr(1+i))
			continue
		}
		if p := r.Processes[1]; !p.Answered || p.Leading || p.RefreshAgeMs < 0 || p.Address != c.addr(11+i) {
			c.t.Errorf("region %s standby: %+v; want %s answering, not leading, with a warm copy", r.Name, p, c.addr(11+i))
		}
	}
	healthy := 0
	for _, m := range st.Etcd {
		if m.Healthy {
			healthy++
		}
	}
	if healthy != 3 {
		c.t.Errorf("etcd %+v: want 3 healthy members", st.Etcd)
	}
	files, servers := 0, 0
	for _, cs := range st.Certificates {
		if strings.HasPrefix(cs.Source, filepath.Join(c.dir, "certs")) {
			files++
		} else {
			servers++
		}
	}
	// 8 processes of ours (2 coordinators, 6 region processes) and 3 etcd members.
	if files == 0 || servers != 11 {
		c.t.Errorf("certificates: %d files, %d servers; want some files and 11 servers: %+v", files, servers, st.Certificates)
	}
}
