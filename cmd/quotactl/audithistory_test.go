package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/pgutil"
)

// history runs quotactl audit history with args and decodes its JSON.
func history(t *testing.T, args ...string) historyJSON {
	t.Helper()
	out, err := run(t, append([]string{"audit", "history", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatalf("audit history: %v\n%s", err, out)
	}
	var h historyJSON
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("audit history -o json: %v\n%s", err, out)
	}
	return h
}

// waitRound waits until the history of sale holds a round after round after that satisfies
// ok, and returns it.
func waitRound(t *testing.T, coord, sale string, after int64, what string, ok func(roundJSON) bool) roundJSON {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range history(t, coord, "--sale", sale).Rounds {
			if r.Round > after && ok(r) {
				return r
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no round after %d %s in 30s", after, what)
	return roundJSON{}
}

// breachOf is the round's I1 violation of sale's phone with the SKU's stored terms, if any.
func breachOf(r roundJSON, sale string) (violationJSON, skuAuditJSON, bool) {
	for _, v := range r.Violations {
		if v.Invariant != "I1" || v.Sale != sale || v.SKU != "phone" || v.Detail == "" {
			continue
		}
		for _, s := range r.Sales {
			for _, k := range s.SKUs {
				if s.Sale == sale && k.SKU == "phone" && !k.OK {
					return v, k, true
				}
			}
		}
	}
	return violationJSON{}, skuAuditJSON{}, false
}

// TestAuditHistoryKeepsABreach: the continuous audit's rounds over a sale's life are stored
// and listed (JSON and CSV that parse); a unit conjured in a region's database shows in the
// round that saw it, with the SKU's terms and each region's pool as evidence, and stays in
// the history after the books are repaired and the rounds are clean again.
func TestAuditHistoryKeepsABreach(t *testing.T) {
	d := startDevWith(t, func(c *cluster.DevConfig) { c.AuditInterval = 100 * time.Millisecond }, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	coord := "--coordinator=" + d.Coordinator.Addr()
	if out, err := run(t, coord, "sale", "create", "--sale", "s", "--sku", "phone=100", "--allocate", "us=1,eu=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	if out, err := run(t, coord, "reserve", "--region", "us", "--sale", "s", "--sku", "phone", "--user", "u1", "--request-key", "k1"); err != nil {
		t.Fatalf("reserve: %v\n%s", err, out)
	}
	held := waitRound(t, coord, "s", 0, "with a unit held", func(r roundJSON) bool {
		return r.OK && len(r.Sales) == 1 && r.Sales[0].SKUs[0].Held == 1
	})
	db, err := pgutil.Open(ctx, d.DBURLs["us"], 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `UPDATE pools SET available = available + 1, credited_in = credited_in + 1 WHERE sale_id = 's'`); err != nil {
		t.Fatal(err)
	}
	bad := waitRound(t, coord, "s", held.Round, "with the breach", func(r roundJSON) bool { _, _, ok := breachOf(r, "s"); return !r.OK && ok })
	if _, err := db.Exec(ctx, `UPDATE pools SET available = available - 1, credited_in = credited_in - 1 WHERE sale_id = 's'`); err != nil {
		t.Fatal(err)
	}
	clean := waitRound(t, coord, "s", bad.Round, "clean again", func(r roundJSON) bool { return r.OK })

	h := history(t, coord, "--sale", "s")
	var kept bool
	for _, r := range h.Rounds {
		if r.Round == bad.Round {
			v, k, ok := breachOf(r, "s")
			kept = ok && k.Available == 100 && k.Total == 100 && len(k.Regions) == 2 && strings.Contains(v.Detail, "101")
			t.Logf("round %d at %s: %s; regions %+v", r.Round, r.At.Format(time.RFC3339Nano), v.Detail, k.Regions)
		}
	}
	if !kept {
		t.Fatalf("the breach's round %d is not in the history with its evidence after the repair (clean round %d): %+v", bad.Round, clean.Round, h.Rounds)
	}
	for i := 1; i < len(h.Rounds); i++ {
		if h.Rounds[i].Round <= h.Rounds[i-1].Round {
			t.Fatalf("rounds not oldest first: %d after %d", h.Rounds[i].Round, h.Rounds[i-1].Round)
		}
	}
	since := history(t, coord, "--sale", "s", "--since", bad.At.Format(time.RFC3339Nano))
	if len(since.Rounds) == 0 || since.Rounds[0].Round != bad.Round {
		t.Fatalf("--since %s: first round %+v, want the breach's %d", bad.At, since.Rounds[:min(1, len(since.Rounds))], bad.Round)
	}
	checkHistoryCSV(t, coord, bad.Round)
}

// checkHistoryCSV: the CSV export parses, has the header and a line per round and SKU, and
// the breach's round's line is not ok and carries the evidence.
func checkHistoryCSV(t *testing.T, coord string, bad int64) {
	t.Helper()
	out, err := run(t, coord, "audit", "history", "--sale", "s", "-o", "csv")
	if err != nil {
		t.Fatalf("audit history -o csv: %v\n%s", err, out)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatalf("audit history -o csv does not parse: %v\n%s", err, out)
	}
	if len(recs) < 4 || strings.Join(recs[0], ",") != strings.Join(historyCSVHeader, ",") {
		t.Fatalf("csv: %d lines, header %v", len(recs), recs[:1])
	}
	var found bool
	for _, r := range recs[1:] {
		if r[0] == strconv.FormatInt(bad, 10) && r[4] == "s" && r[5] == "phone" {
			found = r[6] == "false" && strings.HasPrefix(r[14], "I1: ")
		}
	}
	if !found {
		t.Fatalf("csv has no line of round %d with ok false and its evidence:\n%s", bad, out)
	}
}

// TestAuditHistoryIsPruned: rounds older than the retention leave the ledger as new ones come.
func TestAuditHistoryIsPruned(t *testing.T) {
	d := startDevWith(t, func(c *cluster.DevConfig) {
		c.AuditInterval, c.AuditRetention = 100*time.Millisecond, time.Second
	}, "us")
	coord := "--coordinator=" + d.Coordinator.Addr()
	if out, err := run(t, coord, "sale", "create", "--sale", "s", "--sku", "phone=10", "--allocate", "us=1"); err != nil {
		t.Fatalf("sale create: %v\n%s", err, out)
	}
	first := waitRound(t, coord, "s", 0, "at all", func(roundJSON) bool { return true })
	waitRound(t, coord, "s", first.Round+20, "20 rounds on", func(roundJSON) bool { return true })
	h := history(t, coord, "--sale", "s")
	if len(h.Rounds) == 0 || h.Rounds[0].Round == first.Round {
		t.Fatalf("the first round %d is still listed (%d rounds): nothing pruned", first.Round, len(h.Rounds))
	}
	if age := time.Since(h.Rounds[0].At); age > 3*time.Second {
		t.Fatalf("the oldest round kept is %s old; retention 1s", age)
	}
	t.Logf("%d rounds kept, oldest %d", len(h.Rounds), h.Rounds[0].Round)
}
