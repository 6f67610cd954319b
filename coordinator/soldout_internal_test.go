package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/transfer"
)

// A region that does not answer costs a sold-out round one read timeout, not one per sale:
// no region is asked anything more that round, its sales are left unread (read again next
// round), and the failure is logged at most once a minute, not when the term has ended.
func TestReadUnsoldGivesUpOnARegionOncePerRound(t *testing.T) {
	var stuckCalls, okCalls atomic.Int64
	ok := func(_ context.Context, sale string) (map[string]transfer.Stock, error) {
		okCalls.Add(1)
		return map[string]transfer.Stock{"sku": {Available: 2, Held: 1}}, nil
	}
	stuck := func(ctx context.Context, sale string) (map[string]transfer.Stock, error) {
		stuckCalls.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	var logs bytes.Buffer
	clk := clock.NewManual(time.Unix(1000, 0))
	c := &stockFlags{cfg: &Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), CallTimeout: 300 * time.Millisecond, Clock: clk,
		Regions: []RegionLink{{Name: "us", Unsold: ok}, {Name: "eu", Unsold: stuck}}}}
	ledger := map[skuKey]transfer.Units{}
	for _, s := range []string{"a", "b", "c", "d", "e"} {
		ledger[skuKey{s, "sku"}] = 10
	}
	start := time.Now()
	unsold, _, read := c.readUnsold(context.Background(), ledger)
	took := time.Since(start)
	if stuckCalls.Load() != 1 || took > c.cfg.CallTimeout+time.Second {
		t.Errorf("the silent region was asked %d times, the round took %s; want once, about %s", stuckCalls.Load(), took, c.cfg.CallTimeout)
	}
	if len(read) != 0 {
		t.Errorf("read %v: want no sale read while a region of each does not answer", read)
	}
	if n := strings.Count(logs.String(), "sold-out flags failed"); n != 1 || !strings.Contains(logs.String(), "region=eu") ||
		!strings.Contains(logs.String(), "deadline exceeded") {
		t.Errorf("logged %d failures: %s; want one naming eu and the timeout", n, logs.String())
	}
	c.readUnsold(context.Background(), ledger) // within a minute: not logged again, counted
	clk.Advance(readFailureLogEvery)
	c.readUnsold(context.Background(), ledger)
	if n := strings.Count(logs.String(), "sold-out flags failed"); n != 2 || !strings.Contains(logs.String(), "not_logged_since=1") {
		t.Errorf("logged %d failures: %s; want a second a minute later, saying one was not logged", n, logs.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	clk.Advance(readFailureLogEvery)
	c.readUnsold(ctx, ledger)
	if n := strings.Count(logs.String(), "sold-out flags failed"); n != 2 {
		t.Errorf("a round of a term that ended logged its failures: %s", logs.String())
	}
	c.cfg.Regions[1].Unsold = ok // eu answers again: every sale is read, both regions' units added
	unsold, available, read := c.readUnsold(context.Background(), ledger)
	if len(read) != 5 || unsold[skuKey{"c", "sku"}] != 16 || available[skuKey{"c", "sku"}] != 14 {
		t.Errorf("read %v, unsold %v, available %v: want every sale, 10 + 2 × 3 unsold and 10 + 2 × 2 available", read, unsold, available)
	}
	if okCalls.Load() != 4+2*5 {
		t.Errorf("the answering region was asked %d times; want once in each of the first four rounds (no more once eu failed), 5 sales × 2 regions in the last", okCalls.Load())
	}
}

// A new term finds a sold-out SKU whose flag an earlier term raised: the first round of the
// term must not lower it (it would read "drained" and "sold out" as false for a round at
// every failover); the second raises it as published. A SKU with a unit lowers its flag at
// once, and a flag the watch saw change is published again (checkSeen).
func TestPublishFlagLowersOnlyOnAUnit(t *testing.T) {
	var calls []string
	sf := &stockFlags{cfg: &Config{Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)),
		PublishFlag: func(_ context.Context, f fencing.Flag, sale, sku string, on bool) error {
			calls = append(calls, fmt.Sprintf("%s %s/%s %v", f, sale, sku, on))
			return nil
		}}}
	st := flagState{published: map[flagKey]bool{}, rounds: map[flagKey]int{}}
	gone, open := flagKey{fencing.SoldOut, skuKey{"s", "gone"}}, flagKey{fencing.SoldOut, skuKey{"s", "open"}}
	for round, want := range [][]string{
		{"soldout s/open false"}, // the first round: a unit lowers at once; gone waits
		{"soldout s/gone true"},  // the second: gone is raised, open stays down
		nil,                      // the third: nothing changed
		{"soldout s/gone true"},  // the watch saw gone lowered by someone else: raised again
	} {
		calls = nil
		if round == 3 {
			seen := &seenFlags{flags: map[flagKey]bool{gone: false}}
			sf.checkSeen(seen, newChangeFeed(0, nil), st)
		}
		sf.publishFlag(context.Background(), gone, true, st)
		sf.publishFlag(context.Background(), open, false, st)
		if !slices.Equal(calls, want) {
			t.Errorf("round %d published %v; want %v", round+1, calls, want)
		}
	}
}
