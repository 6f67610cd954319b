package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxHistoryRounds bounds what one audit history lists (--limit).
const maxHistoryRounds = 100000

// csvOutput marks a command that prints CSV with -o csv.
const csvOutput = "csv"

func auditHistoryCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "history",
		Example: `  quotactl audit history --sale launch --since 24h
  quotactl audit history --sale launch --since 2026-12-01T09:00:00Z -o csv > rounds.csv`,
		Short: "List the continuous audit's stored rounds: each SKU's result and each violation's evidence",
		Long: `history lists the rounds of the coordinator's continuous audit kept in the ledger (for
quotad's --audit-retention, default 30 days), oldest first: when each ran, whether every SKU
was ok, and for each violation its evidence. A breach stays in the rounds that saw it after
the books are repaired.

-o json prints every round with each sale's SKUs and their terms; -o csv prints one line per
round and SKU (round_id, at, round_ok, error, sale, sku, ok, the I1 terms, evidence), for a
spreadsheet. The newest --limit rounds are listed.`,
		Annotations: map[string]string{csvOutput: "true"},
		Args:        cobra.NoArgs,
		RunE:        withEnv(runAuditHistory),
	}
	f := cmd.Flags()
	f.String("sale", "", "only the rounds that audited this sale, with its results alone")
	f.String("since", "", "only the rounds since this time (RFC3339) or this long ago (a duration: 24h)")
	f.Int("limit", 1000, fmt.Sprintf("the most rounds listed, the newest (1..%d)", maxHistoryRounds))
	return cmd
}

type roundSaleJSON struct {
	Sale string         `json:"sale"`
	OK   bool           `json:"ok"`
	SKUs []skuAuditJSON `json:"skus"`
}

type roundJSON struct {
	Round      int64           `json:"round_id"`
	At         time.Time       `json:"at"`
	TookMs     int64           `json:"took_ms"`
	OK         bool            `json:"ok"`
	SKUs       int32           `json:"skus"`
	Error      string          `json:"error,omitempty"`
	Violations []violationJSON `json:"violations"`
	Sales      []roundSaleJSON `json:"sales"`
}

type historyJSON struct {
	Rounds []roundJSON `json:"rounds"`
}

// parseSince reads --since: a time (RFC3339) or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usage("--since %q: want RFC3339 (2026-12-01T09:00:00Z) or a positive duration (24h)", s)
}

func runAuditHistory(e *env) error {
	limit := e.v.GetInt("limit")
	if limit < 1 || limit > maxHistoryRounds {
		return usage("--limit %d: must be 1..%d", limit, maxHistoryRounds)
	}
	req := &quotav1.AuditHistoryRequest{SaleId: e.v.GetString("sale")}
	if s := e.v.GetString("since"); s != "" {
		t, err := parseSince(s, time.Now())
		if err != nil {
			return err
		}
		req.Since = timestamppb.New(t)
	}
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	out := historyJSON{Rounds: []roundJSON{}}
	for len(out.Rounds) < limit {
		req.Limit = int32(min(limit-len(out.Rounds), 200))
		resp, err := c.AuditHistory(e.ctx, req)
		if err != nil {
			return fmt.Errorf("audit history: %w", err)
		}
		for _, r := range resp.GetRounds() {
			out.Rounds = append(out.Rounds, toRoundJSON(r))
		}
		if resp.GetNextBeforeRound() <= 0 {
			break
		}
		req.BeforeRound = resp.GetNextBeforeRound()
	}
	slices.Reverse(out.Rounds) // oldest first
	if e.v.GetString("output") == csvOutput {
		return writeHistoryCSV(e.cmd.OutOrStdout(), out)
	}
	return e.print(out, func(w io.Writer) { printHistoryText(w, out) })
}

func toRoundJSON(r *quotav1.AuditRound) roundJSON {
	a := toAuditJSON(&quotav1.AuditResponse{Violations: r.GetViolations()})
	out := roundJSON{Round: r.GetRoundId(), At: r.GetAt().AsTime(), TookMs: r.GetTookMs(), OK: r.GetOk(), SKUs: r.GetSkus(),
		Error: r.GetError(), Violations: a.Violations, Sales: []roundSaleJSON{}}
	for _, s := range r.GetSales() {
		sa := toAuditJSON(&quotav1.AuditResponse{Skus: s.GetSkus()})
		out.Sales = append(out.Sales, roundSaleJSON{Sale: s.GetSaleId(), OK: s.GetOk(), SKUs: sa.SKUs})
	}
	return out
}

func printHistoryText(w io.Writer, h historyJSON) {
	for _, r := range h.Rounds {
		at := r.At.Format(time.RFC3339)
		switch {
		case r.Error != "":
			fmt.Fprintf(w, "round %d %s FAILED to run: %s\n", r.Round, at, r.Error)
		case r.OK:
			fmt.Fprintf(w, "round %d %s ok: %d SKU(s) (%dms)\n", r.Round, at, r.SKUs, r.TookMs)
		default:
			fmt.Fprintf(w, "round %d %s VIOLATED: %d violation(s) in %d SKU(s) (%dms)\n", r.Round, at, len(r.Violations), r.SKUs, r.TookMs)
		}
		for _, v := range r.Violations {
			fmt.Fprintf(w, "  VIOLATION %s %s/%s %s: %s\n", v.Invariant, v.Sale, v.SKU, v.Region, v.Detail)
		}
	}
	fmt.Fprintf(w, "%d round(s)\n", len(h.Rounds))
}

// historyCSVHeader names writeHistoryCSV's columns.
var historyCSVHeader = []string{"round_id", "at", "round_ok", "error", "sale", "sku", "ok", "total", "unallocated",
	"available", "held", "sold", "in_flight", "stranded", "evidence"}

// writeHistoryCSV writes one line per round and SKU, the evidence of the SKU's violations in
// its last column; a round that could not run, and a violation of no SKU, get a line of
// their own.
func writeHistoryCSV(w io.Writer, h historyJSON) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(historyCSVHeader); err != nil {
		return err
	}
	for _, r := range h.Rounds {
		head := []string{strconv.FormatInt(r.Round, 10), r.At.Format(time.RFC3339Nano), strconv.FormatBool(r.OK), r.Error}
		if r.Error != "" {
			if err := cw.Write(append(head, make([]string, len(historyCSVHeader)-len(head))...)); err != nil {
				return err
			}
		}
		for _, s := range r.Sales {
			for _, k := range s.SKUs {
				line := append(slices.Clone(head), s.Sale, k.SKU, strconv.FormatBool(k.OK))
				for _, n := range []int64{k.Total, k.Unallocated, k.Available, k.Held, k.Sold, k.InFlight, k.Stranded} {
					line = append(line, strconv.FormatInt(n, 10))
				}
				if err := cw.Write(append(line, evidence(r.Violations, s.Sale, k.SKU))); err != nil {
					return err
				}
			}
		}
		for _, v := range r.Violations {
			if v.SKU == "" {
				line := append(slices.Clone(head), v.Sale, "", "false", "", "", "", "", "", "", "", v.Invariant+": "+v.Detail)
				if err := cw.Write(line); err != nil {
					return err
				}
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// evidence joins the details of vs about sale's sku.
func evidence(vs []violationJSON, sale, sku string) string {
	var out []string
	for _, v := range vs {
		if v.Sale == sale && v.SKU == sku {
			where := ""
			if v.Region != "" {
				where = " " + v.Region
			}
			out = append(out, v.Invariant+where+": "+v.Detail)
		}
	}
	return strings.Join(out, "; ")
}
