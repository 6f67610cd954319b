package main

import (
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
)

// maxActionsRead bounds the rows one command reads from the action log.
const maxActionsRead = 10_000_000

func actionsCmd() *cobra.Command {
	list := &cobra.Command{
		Use:     "list",
		Example: "  quotactl actions list --after 120 -o csv > actions.csv",
		Short:   "List the operators' action log: who changed what, when, and the result",
		Long: `list prints the coordinator's action log, oldest first: every state-changing call made to a
coordinator (create sale, allocate, transfer, resolve, rebalance, pause, resume; by gRPC with
the client certificate's role and name, or on the console with the login's), its target, the
request, and its result, with each row's hash. quotactl audit --actions verifies the chain.`,
		Annotations: map[string]string{csvOutput: "true"},
		Args:        cobra.NoArgs,
		RunE:        withEnv(runActionsList),
	}
	list.Flags().Int64("after", 0, "only the rows after this sequence number")
	list.Flags().Int("limit", 1000, "the most rows listed (1..1000000)")
	return group("actions", "The operators' action log", list)
}

type actionJSON struct {
	Seq      int64     `json:"seq"`
	At       time.Time `json:"at"`
	Role     string    `json:"role"`
	Actor    string    `json:"actor"`
	Via      string    `json:"via"`
	Action   string    `json:"action"`
	Target   string    `json:"target"`
	Detail   string    `json:"detail"`
	Result   string    `json:"result"`
	PrevHash string    `json:"prev_hash"`
	Hash     string    `json:"hash"`
}

// readActions pages through the action log after seq, at most limit rows, calling fn with
// each page.
func readActions(e *env, after int64, limit int, fn func([]*quotav1.ActionRecord) error) error {
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	for read := 0; read < limit; {
		resp, err := c.ListActions(e.ctx, &quotav1.ListActionsRequest{AfterSeq: after, Limit: int32(min(limit-read, 1000))})
		if err != nil {
			return fmt.Errorf("list actions: %w", err)
		}
		page := resp.GetActions()
		if len(page) == 0 {
			return nil
		}
		if err := fn(page); err != nil {
			return err
		}
		read, after = read+len(page), page[len(page)-1].GetSeq()
	}
	return nil
}

func toAction(r *quotav1.ActionRecord) transfer.Action {
	return transfer.Action{Seq: r.GetSeq(), At: r.GetAt().AsTime(), Role: r.GetRole(), Actor: r.GetActor(), Via: r.GetVia(),
		Action: r.GetAction(), Target: r.GetTarget(), Detail: r.GetDetail(), Result: r.GetResult(), PrevHash: r.GetPrevHash(), Hash: r.GetHash()}
}

func runActionsList(e *env) error {
	limit := e.v.GetInt("limit")
	if limit < 1 || limit > 1_000_000 {
		return usage("--limit %d: must be 1..1000000", limit)
	}
	out := struct {
		Actions []actionJSON `json:"actions"`
	}{Actions: []actionJSON{}}
	err := readActions(e, e.v.GetInt64("after"), limit, func(page []*quotav1.ActionRecord) error {
		for _, r := range page {
			out.Actions = append(out.Actions, actionJSON{r.GetSeq(), r.GetAt().AsTime(), r.GetRole(), r.GetActor(), r.GetVia(), r.GetAction(),
				r.GetTarget(), r.GetDetail(), r.GetResult(), hex.EncodeToString(r.GetPrevHash()), hex.EncodeToString(r.GetHash())})
		}
		return nil
	})
	if err != nil {
		return err
	}
	if e.v.GetString("output") == csvOutput {
		cw := csv.NewWriter(e.cmd.OutOrStdout())
		if err := cw.Write([]string{"seq", "at", "role", "actor", "via", "action", "target", "detail", "result", "prev_hash", "hash"}); err != nil {
			return err
		}
		for _, a := range out.Actions {
			if err := cw.Write([]string{strconv.FormatInt(a.Seq, 10), a.At.Format(time.RFC3339Nano), a.Role, a.Actor, a.Via, a.Action,
				a.Target, a.Detail, a.Result, a.PrevHash, a.Hash}); err != nil {
				return err
			}
		}
		cw.Flush()
		return cw.Error()
	}
	return e.print(out, func(w io.Writer) {
		for _, a := range out.Actions {
			fmt.Fprintf(w, "%d %s %s %s (%s) via %s: %s %s: %s\n", a.Seq, a.At.Format(time.RFC3339), a.Role, a.Actor, a.Hash[:16], a.Via,
				a.Action, a.Target, a.Result)
		}
		fmt.Fprintf(w, "%d action(s)\n", len(out.Actions))
	})
}

type chainJSON struct {
	OK      bool   `json:"ok"`
	Rows    int64  `json:"rows"`
	HeadSeq int64  `json:"head_seq"`
	Head    string `json:"head_hash"`
	// BrokenAt is the first row that does not follow from the ones before it (0: none).
	BrokenAt int64  `json:"broken_at,omitempty"`
	Why      string `json:"why,omitempty"`
}

// runAuditActions is quotactl audit --actions: it reads the whole action log and verifies
// its hash chain here, not trusting the coordinator's word, and with --expect-head that the
// head noted at an earlier check is still in it.
func runAuditActions(e *env) error {
	expect, err := parseHead(e.v.GetString("expect-head"))
	if err != nil {
		return err
	}
	st := transfer.ChainState{Hash: transfer.GenesisHash}
	out := chainJSON{OK: true}
	var seen *transfer.Action
	err = readActions(e, 0, maxActionsRead, func(page []*quotav1.ActionRecord) error {
		rows := make([]transfer.Action, len(page))
		for i, r := range page {
			rows[i] = toAction(r)
			if expect != nil && rows[i].Seq == expect.Seq {
				seen = &rows[i]
			}
		}
		var verr error
		st, verr = st.Verify(rows)
		return verr
	})
	var ce *transfer.ChainError
	switch {
	case errors.As(err, &ce):
		out.OK, out.BrokenAt, out.Why = false, ce.Seq, ce.Why
	case err != nil:
		return err
	case st.Seq >= maxActionsRead:
		out.OK, out.BrokenAt, out.Why = false, st.Seq+1, fmt.Sprintf("the log may hold more than the %d rows one check reads: the rows after it were not verified", maxActionsRead)
	case expect != nil && (seen == nil || hex.EncodeToString(seen.Hash) != hex.EncodeToString(expect.Hash)):
		out.OK, out.BrokenAt, out.Why = false, expect.Seq, "the head noted before (--expect-head) is not in the log: rows from it on were removed or changed"
	}
	out.Rows, out.HeadSeq, out.Head = st.Seq, st.Seq, hex.EncodeToString(st.Hash)
	if err := e.print(out, func(w io.Writer) {
		if out.OK {
			fmt.Fprintf(w, "action log ok: %d row(s), head %d:%s\n", out.Rows, out.HeadSeq, out.Head)
		} else {
			fmt.Fprintf(w, "action log BROKEN at row %d: %s (verified up to row %d)\n", out.BrokenAt, out.Why, out.HeadSeq)
		}
	}); err != nil {
		return err
	}
	if !out.OK {
		return &exitError{code: 1}
	}
	return nil
}

// parseHead reads --expect-head SEQ:HASH (as audit --actions prints the head); nil when empty.
func parseHead(s string) (*transfer.ChainState, error) {
	if s == "" {
		return nil, nil
	}
	seqText, hashText, ok := strings.Cut(s, ":")
	seq, err := strconv.ParseInt(seqText, 10, 64)
	hash, herr := hex.DecodeString(hashText)
	if !ok || err != nil || seq < 1 || herr != nil || len(hash) != 32 {
		return nil, usage("--expect-head %q: want SEQ:HASH as audit --actions prints the head (a sequence number and 64 hex digits)", s)
	}
	return &transfer.ChainState{Seq: seq, Hash: hash}, nil
}
