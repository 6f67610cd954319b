package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func transferCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "transfer",
		Short: "Move units of a SKU between regions (or to/from the unallocated pool)",
		Long: `transfer asks the coordinator to move units with the fenced transfer protocol: debit at the
source, credit at the destination, each step idempotent by transfer id. When the transfer
cannot finish within --wait it prints its current state (pending: in flight; stranded when
its outcome has stayed unknown), not an error; the coordinator keeps driving it, and
'quotactl transfers resolve' settles it once the destination answers.`,
		Example: `  quotactl transfer --sale launch --sku phone --from us --to eu --units 300 --wait 10s -o json`,
		Args:    cobra.NoArgs,
		RunE:    withEnv(runTransfer),
	}
	f := cmd.Flags()
	f.String("sale", "", "sale id (required)")
	f.String("sku", "", "SKU (required)")
	f.String("from", "", "source region, or 'unallocated' (required)")
	f.String("to", "", "destination region, or 'unallocated' (required)")
	f.Int64("units", 0, "units to move (required)")
	f.String("request-key", "", "the request key, which makes the transfer idempotent: run again with the same key to retry safely; default a new random key (printed)")
	cliconf.Alias(f, "request-id", "request-key")
	f.Duration("wait", 10*time.Second, "how long to wait for the transfer to finish")
	return cmd
}

func printTransfer(e *env, t xferJSON) error {
	return e.print(t, func(w io.Writer) {
		fmt.Fprintf(w, "transfer %s: %d %s %s → %s: %s (generation %d, age %s)", t.ID, t.Units, t.SKU, t.From, t.To, t.State, t.Generation, t.Age)
		if t.Stranded {
			fmt.Fprint(w, " STRANDED")
		}
		if t.Replayed {
			fmt.Fprint(w, " (replayed)")
		}
		if t.Reason != "" {
			fmt.Fprintf(w, "\n  %s", t.Reason)
		}
		fmt.Fprintln(w)
	})
}

func runTransfer(e *env) error {
	req := &quotav1.TransferRequest{SaleId: e.v.GetString("sale"), Sku: e.v.GetString("sku"), From: e.v.GetString("from"),
		To: e.v.GetString("to"), Units: e.v.GetInt64("units"), RequestId: e.v.GetString("request-key")}
	if w := e.v.GetDuration("wait"); w < 0 {
		return usage("--wait %s: must not be negative (0: do not wait)", w)
	}
	picked := req.RequestId == ""
	if picked {
		req.RequestId = "manual-" + randomID()
	} else if why := transfer.CheckID(req.RequestId); why != "" {
		return usage("--request-key %q: %s", req.RequestId, why)
	}
	if err := e.checkPools(map[string]string{"from": req.From, "to": req.To}); err != nil {
		return err
	}
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.Transfer(e.ctx, req)
	if picked && mayBeRecorded(err) {
		fmt.Fprintf(e.cmd.ErrOrStderr(), "request key %s (pass --request-key %s to retry this transfer safely)\n", req.RequestId, req.RequestId)
	}
	if err != nil {
		return fmt.Errorf("transfer: %w", err)
	}
	t := resp.GetTransfer()
	for deadline := time.Now().Add(e.v.GetDuration("wait")); !final(t.GetState()) && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		g, err := c.GetTransfer(e.ctx, &quotav1.GetTransferRequest{TransferId: t.GetTransferId()})
		if err != nil {
			return fmt.Errorf("get transfer: %w", err)
		}
		t = g.GetTransfer()
	}
	out := toXferJSON(t)
	out.Replayed = resp.GetReplayed()
	return printTransfer(e, out)
}

// mayBeRecorded tells whether a request's outcome leaves its id worth retrying with: it
// succeeded, or its answer was lost (the coordinator may have recorded it). A refusal (bad
// input, unknown sale, a fenced or deposed coordinator, ...) recorded nothing.
func mayBeRecorded(err error) bool {
	switch status.Code(err) {
	case codes.OK, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal:
		return apierr.Reason(err) != "NOT_LEADER"
	}
	return false
}

func randomID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func final(state string) bool { return state == "posted" || state == "voided" }

func transfersCmd() *cobra.Command {
	return group("transfers", "List and resolve transfers", transfersListCmd(), transfersResolveCmd())
}

func transfersListCmd() *cobra.Command {
	list := &cobra.Command{
		Use: "list",
		Example: `  quotactl transfers list --unfinished
  quotactl transfers list --sale launch -o json`,
		Short: "List transfers with their state, age and whether they are stranded",
		Args:  cobra.NoArgs,
		RunE: withEnv(func(e *env) error {
			c, err := e.coordinator()
			if err != nil {
				return err
			}
			resp, err := c.ListTransfers(e.ctx, &quotav1.ListTransfersRequest{SaleId: e.v.GetString("sale"), UnfinishedOnly: e.v.GetBool("unfinished")})
			if err != nil {
				return fmt.Errorf("list transfers: %w", err)
			}
			out := struct {
				Transfers []xferJSON `json:"transfers"`
			}{Transfers: []xferJSON{}}
			for _, t := range resp.GetTransfers() {
				out.Transfers = append(out.Transfers, toXferJSON(t))
			}
			return e.print(out, func(w io.Writer) {
				// Sale and SKU ids run up to 128 bytes: columns as wide as this list needs.
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "TRANSFER\tSALE\tSTATE\tSKU\tFROM\tTO\tUNITS\tGEN\tAGE\tSTRANDED/REASON")
				for _, t := range out.Transfers {
					flag := ""
					if t.Stranded {
						flag = "STRANDED "
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s%s\n", t.ID, t.Sale, t.State, t.SKU, t.From, t.To, t.Units, t.Generation, t.Age, flag, t.Reason)
				}
				tw.Flush()
			})
		}),
	}
	list.Flags().String("sale", "", "only this sale")
	list.Flags().Bool("unfinished", false, "only transfers not yet posted or voided")
	return list
}

func transfersResolveCmd() *cobra.Command {
	resolve := &cobra.Command{
		Use: "resolve TRANSFER_ID",
		Example: `  quotactl transfers resolve t-f514b3f5f6ab606145977575
  quotactl transfers resolve --refuse t-f514b3f5f6ab606145977575   # cancel it instead, if it can be`,
		Short: "Settle an unfinished (e.g. stranded) transfer by its destination's durable record",
		Long: `resolve asks the destination about the transfer and finishes it by what the destination
records, never by a timeout: credited → posted; refused → restored at the source and voided;
no record → the destination is asked to credit it (or, with --refuse, to refuse it, after
which the source is restored). It fails, changing nothing, while the destination does not answer.

A requested transfer (its source has not confirmed the debit) is driven the same way, or,
with --refuse, cancelled at its source: the source records that it will never debit it and
the transfer is voided; if the source had debited it first, the transfer is refused at the
destination and restored as above. While the source does not answer it stays requested: only
the source knows whether it debited.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usage("resolve takes exactly one TRANSFER_ID, got %d arguments", len(args))
			}
			if why := transfer.CheckID(args[0]); why != "" {
				return usage("TRANSFER_ID %q: %s", args[0], why)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			e, done, err := newEnv(cmd)
			if err != nil {
				return err
			}
			defer done()
			c, err := e.coordinator()
			if err != nil {
				return err
			}
			resp, err := c.ResolveTransfer(e.ctx, &quotav1.ResolveTransferRequest{TransferId: args[0], Refuse: e.v.GetBool("refuse")})
			if err != nil {
				return fmt.Errorf("resolve: %w", err)
			}
			out := toXferJSON(resp.GetTransfer())
			if err := printTransfer(e, out); err != nil {
				return err
			}
			if e.v.GetBool("refuse") && out.State == "posted" {
				fmt.Fprintf(e.cmd.ErrOrStderr(), "note: %s is posted (credited at %s): there was nothing left to cancel\n", out.ID, out.To)
			}
			if !final(out.State) {
				return &exitError{code: 1, err: fmt.Errorf("transfer %s is still %s: %s", out.ID, out.State, out.Reason)}
			}
			return nil
		},
	}
	resolve.Flags().Bool("refuse", false, "cancel the transfer: a requested one at its source, a pending one at its destination (then the source is restored)")
	return resolve
}

func rebalanceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rebalance",
		Short: "Move a SKU's stock toward the regions selling fastest",
		Long: `rebalance reads each region's available units and the units reserved there in the last
--window, expects each region to keep selling at that rate for --horizon, and moves stock
from pools with more than they need to pools with less, in transfers of at least --min-units.
The unallocated pool has no demand of its own, so all of it counts as spare; it is not
preferred: sources give in the order of their spare units, largest first. A source is never
taken below what it needs itself, and a region whose database cannot be read is left out
entirely.

--dry-run and --plan both move nothing, but show two different planners. --dry-run shows this
command's plan, the one it would run without --dry-run: from --window, --horizon and
--min-units, for one SKU. --plan shows the coordinator's automatic rebalancer, another planner
with its own settings (quotad's --rebalance-window, --rebalance-horizon, --rebalance-min-units,
and the rules below), which this command never runs; --window, --horizon, --min-units,
--request-key and --dry-run do not apply to it, and giving one with --plan is an error.

With --plan it shows what the coordinator's automatic rebalancer would do next for each SKU of
the sale (or --sku's), and why: each pool's available units, the units on their way to it,
its recent demand and rate, its need over the horizon and its projected time to empty; the moves; and what holds them back (the sale's --rebalance manual, the
coordinator's --auto-rebalance=false, a pause, the cap on transfers in flight, the cooldown).
Near sell-out (fewer units left than the regions expect to sell within the horizon) a region
whose buyers went quiet gives its last units to the regions whose buyers are still arriving;
a region with a stranded transfer out gives nothing until it is resolved.`,
		Example: `  quotactl rebalance --sale launch --sku phone --dry-run
  quotactl rebalance --sale launch --plan -o json`,
		Args: cobra.NoArgs,
		RunE: withEnv(runRebalance),
	}
	f := cmd.Flags()
	f.String("sale", "", "sale id (required)")
	f.String("sku", "", "SKU (needed to move; with --plan, every SKU when empty)")
	f.Bool("dry-run", false, "print the plan this command would run (from --window, --horizon, --min-units) and move nothing")
	f.Bool("plan", false, "show instead the coordinator's automatic rebalancer's next step and why, by its own settings; moves nothing")
	f.Duration("window", time.Minute, "how far back the hold rate is measured")
	f.Duration("horizon", time.Minute, "how far ahead each region should be stocked at its rate")
	f.Int64("min-units", 10, "smallest transfer worth making")
	f.String("request-key", "", "the request key, which makes the rebalance idempotent: the prefix of its transfers' keys (retry a rebalance with the same one); default a new random one")
	cliconf.Alias(f, "request-id", "request-key")
	return cmd
}

// planIgnores are the flags of this command's own planner, which --plan (the automatic
// rebalancer's) does not use.
var planIgnores = []string{"dry-run", "window", "horizon", "min-units", "request-key"}

// checkPlanFlags refuses, with --plan, a flag of the other planner given on the command line
// (exit 2): it would be silently ignored. One from QUOTA_* or the config file is let be.
func checkPlanFlags(e *env) error {
	for _, name := range planIgnores {
		if f := e.cmd.Flags().Lookup(name); f.Changed && strings.HasPrefix(cliconf.Source(f), "--") {
			return usage("--%s with --plan: --plan shows the coordinator's automatic rebalancer, which has its own settings (quotad --rebalance-*); --%s belongs to this command's own planner: see %s --help",
				name, name, e.cmd.CommandPath())
		}
	}
	return nil
}

// checkRebalanceFlags refuses a rebalance's missing or out-of-range flags (exit 2).
func checkRebalanceFlags(e *env) error {
	if e.v.GetString("sku") == "" {
		return usage("--sku: required (see %s --help), unless --plan", e.cmd.CommandPath())
	}
	for _, name := range []string{"window", "horizon"} {
		if d := e.v.GetDuration(name); d <= 0 {
			return usage("--%s %s: must be positive", name, d)
		}
	}
	if n := e.v.GetInt64("min-units"); n <= 0 {
		return usage("--min-units %d: must be positive", n)
	}
	return nil
}

func runRebalance(e *env) error {
	if e.v.GetBool("plan") {
		if err := checkPlanFlags(e); err != nil {
			return err
		}
		return runRebalancePlan(e)
	}
	if err := checkRebalanceFlags(e); err != nil {
		return err
	}
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	rid := e.v.GetString("request-key")
	picked := rid == "" && !e.v.GetBool("dry-run")
	if picked {
		rid = "rebalance-" + randomID()
	}
	resp, err := c.Rebalance(e.ctx, &quotav1.RebalanceRequest{SaleId: e.v.GetString("sale"), Sku: e.v.GetString("sku"),
		DryRun: e.v.GetBool("dry-run"), WindowMs: e.v.GetDuration("window").Milliseconds(), HorizonMs: e.v.GetDuration("horizon").Milliseconds(),
		MinUnits: e.v.GetInt64("min-units"), RequestId: rid})
	if picked && mayBeRecorded(err) && (err != nil || len(resp.GetTransfers()) > 0) { // an empty plan records nothing
		fmt.Fprintf(e.cmd.ErrOrStderr(), "request key %s (pass --request-key %s to retry this rebalance safely)\n", rid, rid)
	}
	if err != nil {
		return fmt.Errorf("rebalance: %w", err)
	}
	type poolJSON struct {
		Pool      string `json:"pool"`
		Available int64  `json:"available"`
		Recent    int64  `json:"recent"`
		Need      int64  `json:"need"`
	}
	out := struct {
		DryRun    bool       `json:"dry_run"`
		Pools     []poolJSON `json:"pools"`
		Plan      []moveJSON `json:"plan"`
		Transfers []xferJSON `json:"transfers"`
		Replayed  bool       `json:"replayed"`
	}{DryRun: e.v.GetBool("dry-run"), Pools: []poolJSON{}, Plan: []moveJSON{}, Transfers: []xferJSON{}, Replayed: resp.GetReplayed()}
	for _, p := range resp.GetPools() {
		out.Pools = append(out.Pools, poolJSON{p.GetPool(), p.GetAvailable(), p.GetRecent(), p.GetNeed()})
	}
	for _, m := range resp.GetMoves() {
		out.Plan = append(out.Plan, moveJSON{m.GetFrom(), m.GetTo(), m.GetUnits()})
	}
	for _, t := range resp.GetTransfers() {
		out.Transfers = append(out.Transfers, toXferJSON(t))
	}
	return e.print(out, func(w io.Writer) {
		fmt.Fprintf(w, "%-12s %10s %10s %10s\n", "POOL", "AVAILABLE", "RECENT", "NEED")
		for _, p := range out.Pools {
			fmt.Fprintf(w, "%-12s %10d %10d %10d\n", p.Pool, p.Available, p.Recent, p.Need)
		}
		if out.Replayed {
			fmt.Fprintf(w, "replayed: request key %s moved this before; nothing was planned now\n", rid)
		} else if len(out.Plan) == 0 {
			fmt.Fprintln(w, "plan: nothing to move")
		}
		for _, m := range out.Plan {
			fmt.Fprintf(w, "plan: %d %s → %s\n", m.Units, m.From, m.To)
		}
		for _, t := range out.Transfers {
			fmt.Fprintf(w, "transfer %s: %d %s %s → %s: %s\n", t.ID, t.Units, t.SKU, t.From, t.To, t.State)
		}
	})
}
