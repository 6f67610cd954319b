package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/cmd/quotactl/internal/bench"
	"github.com/quotaworks/quota/internal/testpg"
)

// TestBenchScaleRunsEveryPoint runs `quotactl bench scale` at tiny sizes against the real
// PostgreSQL: every curve has every point, in order, each measured and clean; the text
// report has every table; and the run's databases are gone afterwards.
func TestBenchScaleRunsEveryPoint(t *testing.T) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "quota_t_scale_" + hex.EncodeToString(b[:])
	out, err := run(t, "bench", "scale", "--pg-url", testpg.AdminURL(), "--db-prefix", prefix, "--pools", "1,10", "--pool-ops", "300",
		"--concurrency", "8", "--sales", "1,2", "--idle-window", "1s", "--audit-interval", "1h", "--closed-holds", "0,1000", "--takeover-live", "50", "--takeover-runs", "2", "--live-ops", "20",
		"--transfers", "4,8,20", "--transfers-via-coordinator", "8", "--audit-holds", "30,90", "--audit-runs", "2", "--duration", "20s", "--curve-timeout", "90s", "-o", "json")
	if err != nil {
		t.Fatalf("bench scale: %v\n%s", err, out)
	}
	var rep bench.ScaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("decode the report: %v\n%s", err, out)
	}
	checkPoolsCurve(t, rep.Pools)
	checkIdleCurve(t, rep.Coordinator)
	checkTakeoverCurve(t, rep.Takeover)
	checkAuditCurve(t, rep.Audit)
	if rep.Setup.CPUs == 0 || rep.Setup.Postgres == "" || rep.Setup.LoadAvgEnd == "" {
		t.Errorf("setup %+v: want the CPUs, PostgreSQL's version and the load averages", rep.Setup)
	}
	var text bytes.Buffer
	printScale(&text, &rep)
	for _, h := range []string{"POOLS:", "COORDINATOR:", "TAKEOVER:", "AUDIT:", "sold-out loop + rebalancer"} {
		if !strings.Contains(text.String(), h) {
			t.Errorf("the text report has no %q:\n%s", h, text.String())
		}
	}
	assertScaleDropped(t, prefix)
}

func checkPoolsCurve(t *testing.T, pts []bench.PoolsPoint) {
	t.Helper()
	if len(pts) != 4 || pts[0].Pools != 1 || pts[3].Pools != 10 || pts[3].Sales != 1 {
		t.Fatalf("pools curve %+v: want points at 1 and 10 pools (10 in one sale), two loads each", pts)
	}
	for i, p := range pts {
		load := []string{bench.LoadHot, bench.LoadSpread}[i%2]
		if p.Load != load || p.Reservations != 300 || p.Errors != 0 || p.ReservationsPerSec <= 0 || p.P99Ms <= 0 || p.HoldRows != int64(300*(i%2+1)) {
			t.Errorf("pools point %+v: want the %s load, 300 reservations, no error, a rate, a p99 and %d holds stored", p, load, 300*(i%2+1))
		}
	}
}

func checkIdleCurve(t *testing.T, pts []bench.IdlePoint) {
	t.Helper()
	if len(pts) != 6 {
		t.Fatalf("coordinator curve has %d points, want 2 modes × (0, 1, 2 sales)", len(pts))
	}
	var ledger float64
	for i, p := range pts {
		mode, sales := bench.ModeSoldOutLoop, []int{0, 1, 2}[i%3]
		if i >= 3 {
			mode = bench.ModeBothLoops
		}
		if p.Mode != mode || p.Sales != sales || p.SKUs != 10 || p.AuditEverySec != 3600 || p.WindowSec < 1 || len(p.TxPerSec) != 3 || p.ProcessCPUPct <= 0 {
			t.Errorf("coordinator point %d %+v: want %s with %d sales of 10 SKUs, the audit every hour, a window of 1 s, three region databases and the CPU", i, p, mode, sales)
		}
		for c := range p.ComponentCPUPct { // what the profile can attribute CPU to: the cluster's components and the bench
			if !slices.Contains([]string{"coordinator", "region/us", "region/eu", "region/ap", "etcd", "etcd-client", "other"}, c) {
				t.Errorf("coordinator point %d: CPU by component %v names %q, not a component of the cluster", i, p.ComponentCPUPct, c)
			}
		}
		ledger += p.LedgerTxPerSec
		// Reading every sale every half second would be 4 transactions a second at every region
		// database with 2 sales; idle sales are read only when they change. The audit runs at
		// the rig's start and then an hour apart: a round reads every SKU of every sale at
		// every region (some 16 transactions a sale there), so one in a 1 s window would
		// hide what this bounds. Polling shows at every region: the least of the three is
		// the one a poll cannot hide from.
		if least := leastTxPerSec(p.TxPerSec); mode == bench.ModeSoldOutLoop && sales == 2 && least >= 4 {
			t.Errorf("coordinator point %d %+v: %.1f transactions/s at the least busy region database with 2 idle sales; want fewer than 4", i, p, least)
		}
	}
	if ledger <= 0 {
		t.Errorf("no transaction counted at the ledger: %+v", pts)
	}
}

// leastTxPerSec is the smallest of the region databases' transaction rates.
func leastTxPerSec(byRegion map[string]float64) float64 {
	least := -1.0
	for _, r := range byRegion {
		if least < 0 || r < least {
			least = r
		}
	}
	return least
}

// checkTakeoverCurve: the archived history is in holds_closed, never in the holds table a
// cold takeover reads, which holds the live holds (and the warm part's reservations) alone.
func checkTakeoverCurve(t *testing.T, pts []bench.TakeoverPoint) {
	t.Helper()
	if len(pts) != 2 || pts[0].ClosedHolds != 0 || pts[1].ClosedHolds != 1000 {
		t.Fatalf("takeover curve %+v: want points at 0 and 1000 archived holds", pts)
	}
	for i, p := range pts {
		reserved := int64(20 * i) // the warm part of each point before reserves 20
		if p.ArchivedRows != p.ClosedHolds || p.HoldRows != 50+reserved || len(p.ColdRuns) != 2 || len(p.BaselineRuns) != 2 ||
			p.ColdMs <= 0 || p.BaselineMs <= 0 || p.ColdVsBaseline <= 0 {
			t.Errorf("takeover point %+v: want %d archived rows, %d rows in holds (the live ones), two cold runs of each database and a ratio",
				p, p.ClosedHolds, 50+reserved)
		}
		if p.WarmMs <= 0 || !p.Warm || p.LiveHolds != 50+reserved+20 {
			t.Errorf("takeover point %+v: want a warm time, the standby's takeover warm, %d live holds", p, 50+reserved+20)
		}
	}
}

func checkAuditCurve(t *testing.T, pts []bench.AuditPoint) {
	t.Helper()
	want := []struct {
		transfers int
		holds     int64
	}{{4, 0}, {8, 0}, {20, 0}, {20, 30}, {20, 90}} // transfers past 8 stored as copies: the audit finds them whole
	if len(pts) != len(want) {
		t.Fatalf("audit curve %+v: want %d points", pts, len(want))
	}
	for i, p := range pts {
		if p.Transfers != want[i].transfers || p.Holds != want[i].holds || !p.OK || len(p.Runs) != 2 || p.Ms <= 0 {
			t.Errorf("audit point %+v: want %d transfers, %d holds, two clean audits timed", p, want[i].transfers, want[i].holds)
		}
	}
}

func assertScaleDropped(t *testing.T, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testpg.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)`, prefix).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d databases named %s* left behind", left, prefix)
	}
}
