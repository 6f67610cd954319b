package coordinator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/transfer"
)

// errUnreachable is what the fake region answers to every call that is not Settle.
var errUnreachable = errors.New("region unreachable")

// silentRegion is a participant that never answers a protocol step (so the driver strands
// the transfer) but records Settle, so a posted transfer reaches the ledger's settled write.
type silentRegion struct{}

func (silentRegion) PutSale(context.Context, int64, SaleTerms) error { return errUnreachable }
func (silentRegion) Credit(context.Context, int64, transfer.Transfer) (transfer.InState, error) {
	return "", errUnreachable
}
func (silentRegion) Refuse(context.Context, int64, transfer.Transfer) (transfer.InState, error) {
	return "", errUnreachable
}
func (silentRegion) Debit(context.Context, int64, transfer.Transfer) (transfer.OutState, error) {
	return "", errUnreachable
}
func (silentRegion) RefuseDebit(context.Context, int64, transfer.Transfer) (transfer.OutState, error) {
	return "", errUnreachable
}
func (silentRegion) Restore(context.Context, int64, transfer.Transfer) (transfer.OutState, error) {
	return "", errUnreachable
}
func (silentRegion) Settle(context.Context, int64, transfer.Transfer) (transfer.OutState, error) {
	return transfer.OutSettled, nil
}
func (silentRegion) Status(context.Context, string) (transfer.InState, transfer.OutState, error) {
	return "", "", errUnreachable
}
func (silentRegion) SetPaused(context.Context, int64, Pause) (bool, PauseVersion, error) {
	return false, 0, errUnreachable
}

const (
	testGen     = int64(1)
	strandAfter = time.Minute
	testXfer    = "t-drive-errors"
)

// driverFixture is a migrated ledger holding one transfer, and a coordinator (not leading:
// no background loop runs) that logs as JSON into logs.
type driverFixture struct {
	db   *pgxpool.Pool
	c    *Coordinator
	logs *bytes.Buffer
}

func newDriverFixture(t *testing.T, state transfer.State, from string, age time.Duration) driverFixture {
	t.Helper()
	ctx := context.Background()
	db, _ := testpg.NewPool(t, "drverr", 4)
	if err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	now := clk.Now()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO sales (sale_id, per_user_limit, hold_ttl_ms, opens_at, created_at, definition)
			VALUES ('s', 1, 60000, $1, $1, 'd')`, []any{now}},
		{`INSERT INTO skus (sale_id, sku, total, unallocated) VALUES ('s', 'phone', 10, 0)`, nil},
		{`INSERT INTO transfers (transfer_id, request_id, sale_id, sku, from_pool, to_pool, units, state, generation, settled, created_at, updated_at)
			VALUES ($1, 'transfer/r', 's', 'phone', $2, 'eu', 5, $3, 1, false, $4, $4)`,
			[]any{testXfer, from, string(state), now.Add(-age)}},
	} {
		if _, err := db.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	books := func(context.Context, string) (transfer.RegionBooks, error) { return transfer.RegionBooks{}, nil }
	logs := &bytes.Buffer{}
	c, err := New(Config{
		Regions: []RegionLink{
			{Name: "us", Participant: silentRegion{}, Books: books},
			{Name: "eu", Participant: silentRegion{}, Books: books},
		},
		Clock: clk, StrandAfter: strandAfter, RetryInterval: time.Hour,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}, db)
	if err != nil {
		t.Fatal(err)
	}
	return driverFixture{db: db, c: c, logs: logs}
}

func (f driverFixture) exec(t *testing.T, sql string) {
	t.Helper()
	if _, err := f.db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// row is the transfer's ledger row as the driver may change it.
func (f driverFixture) row(t *testing.T) string {
	t.Helper()
	var state, reason string
	var stranded, settled bool
	err := f.db.QueryRow(context.Background(), `SELECT state, stranded, settled, coalesce(reason, '<null>')
		FROM transfers WHERE transfer_id = $1`, testXfer).Scan(&state, &stranded, &settled, &reason)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal([]any{state, stranded, settled, reason})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// logged reports whether a WARN record with msg and step (and transfer, when not "") was
// logged since the last reset, with fenced as given when the record has that attribute.
func (f driverFixture) logged(t *testing.T, msg, step, id string, fenced bool) bool {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(f.logs.Bytes()))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if rec["level"] != "WARN" || rec["msg"] != msg || rec["step"] != step || rec["err"] == nil {
			continue
		}
		if id != "" && (rec["transfer"] != id || rec["fenced"] != fenced) {
			continue
		}
		return true
	}
	return false
}

// TestDriverReportsFailedWrites: each ledger write of the stranding and settling path, and
// the background round's scan of unfinished transfers, is made to fail against the real
// PostgreSQL (the ledger fence raised above the coordinator's generation, a trigger that
// refuses the update, an unconfigured region, a row that does not scan). The failure is
// returned (to errors.Is: ErrFenced when fenced, and only then), logged at WARN with the
// transfer and the step, and the transfer is left where it was in the ledger. Once the
// fault is gone, the same drive writes what it could not.
func TestDriverReportsFailedWrites(t *testing.T) {
	const (
		fence   = `UPDATE ledger_fence SET generation = 2` // a newer coordinator leads
		unfence = `UPDATE ledger_fence SET generation = 1`
		refuse  = `CREATE FUNCTION refuse_update() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN RAISE EXCEPTION 'injected: % refused', TG_ARGV[0]; END $$;
			CREATE TRIGGER refuse BEFORE UPDATE OF %s ON transfers FOR EACH ROW EXECUTE FUNCTION refuse_update('%s')`
		unrefuse = `DROP TRIGGER refuse ON transfers`
	)
	trigger := func(col string) string { return strings.ReplaceAll(refuse, "%s", col) }
	cases := []struct {
		name        string
		state       transfer.State
		from        string
		age         time.Duration // how long before now the transfer was created
		fault, heal string
		step        string // the step the log and the error name
		fenced      bool
		scanOnly    bool   // the failure is the round's own, not one transfer's
		healed      string // a predicate on the row once the fault is gone
	}{
		{name: "reason update fenced", state: transfer.Requested, from: "us", fault: fence, heal: unfence,
			step: "strand: record reason", fenced: true, healed: `reason LIKE 'debit at us:%' AND NOT stranded`},
		{name: "reason update refused", state: transfer.Requested, from: "us", fault: trigger("reason"), heal: unrefuse,
			step: "strand: record reason", healed: `reason LIKE 'debit at us:%' AND NOT stranded`},
		{name: "stranded flag fenced", state: transfer.Pending, from: "us", age: 2 * strandAfter, fault: fence, heal: unfence,
			step: "strand: flag stranded", fenced: true, healed: `stranded AND state = 'pending'`},
		{name: "stranded flag refused", state: transfer.Pending, from: "us", age: 2 * strandAfter, fault: trigger("stranded"), heal: unrefuse,
			step: "strand: flag stranded", healed: `stranded AND state = 'pending'`},
		{name: "settled flag fenced", state: transfer.Posted, from: "us", fault: fence, heal: unfence,
			step: "settle: record settled", fenced: true, healed: `settled AND state = 'posted'`},
		{name: "settled flag refused", state: transfer.Posted, from: "us", fault: trigger("settled"), heal: unrefuse,
			step: "settle: record settled", healed: `settled AND state = 'posted'`},
		{name: "settle from an unconfigured region", state: transfer.Posted, from: "ap", step: "settle: source"},
		{name: "unfinished scan", state: transfer.Requested, from: "us",
			fault: `ALTER TABLE transfers ALTER COLUMN reason DROP NOT NULL; UPDATE transfers SET reason = NULL`,
			heal:  `UPDATE transfers SET reason = ''`, step: "scan unfinished transfers", scanOnly: true,
			healed: `reason LIKE 'debit at us:%'`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newDriverFixture(t, tc.state, tc.from, tc.age)
			if tc.fault != "" {
				f.exec(t, tc.fault)
			}
			before := f.row(t)
			ctx := context.Background()

			f.logs.Reset()
			err := f.c.driver.unfinished(ctx, testGen)
			f.checkReported(t, "driveUnfinished", err, tc.step, tc.fenced, tc.scanOnly)
			if !tc.scanOnly { // as Transfer, Allocate and Resolve drive it
				tr, err := f.c.GetTransfer(ctx, testXfer)
				if err != nil {
					t.Fatal(err)
				}
				f.logs.Reset()
				tr, err = f.c.driver.drive(ctx, testGen, tr)
				f.checkReported(t, "drive", err, tc.step, tc.fenced, false)
				if tr.State != tc.state || tr.Stranded || tr.Settled {
					t.Errorf("drive returned %s stranded=%v settled=%v; want %s, neither flag", tr.State, tr.Stranded, tr.Settled, tc.state)
				}
			}
			if after := f.row(t); after != before {
				t.Errorf("ledger row %s after the failed write, was %s: it must stay where it was", after, before)
			}
			if tc.heal == "" {
				return
			}
			f.exec(t, tc.heal)
			if err := f.c.driver.unfinished(ctx, testGen); err != nil {
				t.Fatalf("driveUnfinished with the fault gone: %v", err)
			}
			var ok bool
			if err := f.db.QueryRow(ctx, `SELECT `+tc.healed+` FROM transfers WHERE transfer_id = $1`, testXfer).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			if !ok {
				t.Errorf("with the fault gone, row %s; want %s", f.row(t), tc.healed)
			}
		})
	}
}

// checkReported checks that err is the failure of step (ErrFenced exactly when fenced),
// names the transfer unless it is the round's own, and was logged at WARN with the step.
func (f driverFixture) checkReported(t *testing.T, via string, err error, step string, fenced, roundOnly bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error; want the failure of %q", via, step)
	}
	if !strings.Contains(err.Error(), step) || (!roundOnly && !strings.Contains(err.Error(), testXfer)) {
		t.Errorf("%s: %v; want it to name step %q and transfer %s", via, err, step, testXfer)
	}
	if errors.Is(err, ErrFenced) != fenced {
		t.Errorf("%s: errors.Is(%v, ErrFenced) = %v, want %v", via, err, !fenced, fenced)
	}
	msg, id := "transfer step failed", testXfer
	if roundOnly {
		msg, id = step, ""
	}
	if !f.logged(t, msg, step, id, fenced) {
		t.Errorf("%s: no WARN %q record for step %q, transfer %q, fenced=%v in the log:\n%s", via, msg, step, id, fenced, f.logs)
	}
}
