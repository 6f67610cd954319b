package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/transfer"
)

// TestUnreadRegionIsTheOnlyViolation: a region whose database cannot be read makes the audit
// fail with "conservation unproven" for it, and nothing else: its units are unseen, not
// lost, so no I1 sum is reported as missing them. With every region read, a real shortfall
// still is.
func TestUnreadRegionIsTheOnlyViolation(t *testing.T) {
	snap := ledgerSnapshot{sales: []string{"s"}, skus: map[string][]SKULedger{"s": {{SKU: "phone", Total: 100}}},
		transfers: map[string]transfer.Transfer{}}
	regions := []RegionLink{{Name: "us"}, {Name: "eu"}}
	pool := func(avail transfer.Units) regionRead {
		return regionRead{books: transfer.RegionBooks{Pools: []transfer.PoolBooks{{Sale: "s", SKU: "phone", Available: avail, CreditedIn: avail}}}}
	}
	books := map[string]map[string]regionRead{
		"us": {"s": pool(60)},
		"eu": {"s": {err: errors.New("lock timeout")}},
	}
	rep, _ := evaluate(snap, books, regions, true)
	if rep.OK || len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0].Detail, "could not be read") {
		t.Fatalf("eu unread: %+v; want exactly its unproven-conservation violation", rep.Violations)
	}
	books["eu"] = map[string]regionRead{"s": pool(30)} // read, and 10 units short
	rep, _ = evaluate(snap, books, regions, true)
	if rep.OK || len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0].Detail, "total 100 != ") {
		t.Fatalf("eu read, 10 short: %+v; want the I1 sum violation", rep.Violations)
	}
}

// TestAuditThroughAClosedPoolIsAnError: a region read that fails because this process closed
// its own pool to the region's database (it is stopping) makes the audit an error, not a
// report of I1 unproven; any other read failure stays a violation in the report.
func TestAuditThroughAClosedPoolIsAnError(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	readErr := pgutil.ReadTx(context.Background(), pool, func(pgx.Tx) error { return nil }) // as region.ReadBooks reads
	closed := map[string]map[string]regionRead{"us": {"s": {err: fmt.Errorf("read books of region us: %w", readErr)}}}
	if err := closedOwnPool(closed); err == nil || !strings.Contains(err.Error(), "region us") {
		t.Fatalf("a read through a closed pool (%v): %v, want an error naming region us", readErr, err)
	}
	other := map[string]map[string]regionRead{"us": {"s": {err: errors.New("lock timeout")}}}
	if err := closedOwnPool(other); err != nil {
		t.Fatalf("another read failure: %v, want it left to the report", err)
	}
}
