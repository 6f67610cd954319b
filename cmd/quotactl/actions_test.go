package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/pgutil"
)

// auditActions runs audit --actions (with args) and decodes its report and exit status.
func auditActions(t *testing.T, args ...string) (chainJSON, int) {
	t.Helper()
	out, err := run(t, append([]string{"audit", "--actions", "-o", "json"}, args...)...)
	code := 0
	var ee *exitError
	if errors.As(err, &ee) && ee.err == nil {
		code = ee.code
	} else if err != nil {
		t.Fatalf("audit --actions: %v\n%s", err, out)
	}
	var c chainJSON
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("audit --actions -o json: %v\n%s", err, out)
	}
	return c, code
}

// TestActionLogRecordsAndDetectsTampering: an operator's changes (a sale created and
// allocated, paused, resumed, a transfer, a refused transfer) are recorded with the
// certificate's role and name and their result, listed as JSON and CSV; audit --actions finds
// the chain intact, then a row changed in the ledger's database (exit 1, at that row), a row
// deleted (at the row after it), and the newest row deleted (against the head noted before).
func TestActionLogRecordsAndDetectsTampering(t *testing.T) {
	d := startDev(t, "us", "eu")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	coord := "--coordinator=" + d.Coordinator.Addr()
	for _, args := range [][]string{
		{"sale", "create", "--sale", "s", "--sku", "phone=100", "--allocate", "us=1,eu=1"},
		{"sale", "pause", "--sale", "s", "--reason", "checking"},
		{"sale", "resume", "--sale", "s"},
		{"transfer", "--sale", "s", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "5"},
	} {
		if out, err := run(t, append([]string{coord}, args...)...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	if out, err := run(t, coord, "transfer", "--sale", "s", "--sku", "phone", "--from", "us", "--to", "eu", "--units", "1000"); err == nil {
		t.Fatalf("a transfer of more than us has succeeded:\n%s", out)
	}
	out, err := run(t, coord, "actions", "list", "-o", "json")
	if err != nil {
		t.Fatalf("actions list: %v\n%s", err, out)
	}
	var list struct {
		Actions []actionJSON `json:"actions"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("actions list -o json: %v\n%s", err, out)
	}
	var got []string
	for _, a := range list.Actions {
		if a.Role != "operator" || a.Actor == "" || a.Via != "grpc" {
			t.Fatalf("action %+v: want the operator's certificate by gRPC", a)
		}
		got = append(got, a.Action+" "+strings.SplitN(a.Result, ":", 2)[0])
	}
	want := "create sale ok,allocate ok,pause ok,resume ok,transfer ok,transfer error"
	if strings.Join(got, ",") != want {
		t.Fatalf("actions %v; want %s", got, want)
	}
	csvOut, err := run(t, coord, "actions", "list", "-o", "csv")
	recs, cerr := csv.NewReader(strings.NewReader(csvOut)).ReadAll()
	if err != nil || cerr != nil || len(recs) != len(list.Actions)+1 || recs[1][3] != list.Actions[0].Actor {
		t.Fatalf("actions list -o csv: %v %v\n%s", err, cerr, csvOut)
	}
	c, code := auditActions(t, coord)
	if code != 0 || !c.OK || c.Rows != 6 {
		t.Fatalf("audit --actions of an untouched log: exit %d %+v", code, c)
	}
	head := fmt.Sprintf("%d:%s", c.HeadSeq, c.Head)
	tamperActions(ctx, t, d.DBURLs["coordinator"], coord, head)
}

// tamperActions changes, deletes, and deletes the newest row of the action log in the
// ledger's database, each found by audit --actions.
func tamperActions(ctx context.Context, t *testing.T, url, coord, head string) {
	t.Helper()
	db, err := pgutil.Open(ctx, url, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := func(sql string) {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE actions SET result = 'error: refused' WHERE seq = 3`) // a pause that "failed"
	if c, code := auditActions(t, coord); code != 1 || c.OK || c.BrokenAt != 3 {
		t.Fatalf("audit --actions with row 3 changed: exit %d %+v; want exit 1 at row 3", code, c)
	}
	exec(`UPDATE actions SET result = 'ok' WHERE seq = 3`)
	if c, code := auditActions(t, coord); code != 0 || !c.OK {
		t.Fatalf("audit --actions with row 3 restored: exit %d %+v", code, c)
	}
	exec(`DELETE FROM actions WHERE seq = 4`)
	if c, code := auditActions(t, coord); code != 1 || c.BrokenAt != 5 {
		t.Fatalf("audit --actions with row 4 deleted: exit %d %+v; want exit 1 at row 5", code, c)
	}
	t.Logf("row 4 deleted: %+v", func() chainJSON { c, _ := auditActions(t, coord); return c }())
	exec(`DELETE FROM actions WHERE seq >= 4`) // the newest rows gone: the chain itself holds
	if c, code := auditActions(t, coord); code != 0 || c.HeadSeq != 3 {
		t.Fatalf("audit --actions of the log cut short, without a head: exit %d %+v", code, c)
	}
	if c, code := auditActions(t, coord, "--expect-head", head); code != 1 || c.OK {
		t.Fatalf("audit --actions --expect-head %s of the log cut short: exit %d %+v; want exit 1", head, code, c)
	}
}
