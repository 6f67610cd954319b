package main

import (
	"fmt"
	"io"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/spf13/cobra"
)

func auditCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "audit",
		Example: `  quotactl audit --sale launch          # exit 1 on any violation
  quotactl audit -o json                # every sale
  quotactl audit --limits --sale launch # no buyer over the per-user limit across regions`,
		Short: "Check conservation: I1 per SKU, I2/I3 per pool, I5 per transfer; exit 1 on a violation",
		Long: `audit asks the coordinator to read its ledger and every region's database (read-only,
so a stopped region process does not block it) and check, per SKU:

  total = unallocated + Σ regions (available + held + sold) + in_flight

with stranded units reported inside in_flight, and per region pool:
credited_in − debited_out = available + held + sold, and held/sold equal to the sums of
the pool's holds. The exit status is 1 when any invariant fails.

--limits checks the per-user limit instead: every buyer's held and sold units of each SKU,
read from every region's database and summed, must not exceed the sale's limit; each buyer
over it is listed with their units per region and the region etcd binds them to.

--actions verifies the operators' action log instead (quotactl actions list): it reads every
row and checks each row's hash and its link to the row before; the first row changed, or
following a removed one, is reported and the exit status is 1. It prints the head
(SEQ:HASH); pass it to a later check as --expect-head to find the newest rows removed too.`,
		Args: cobra.NoArgs,
		RunE: withEnv(runAudit),
	}
	cmd.Flags().String("sale", "", "audit only this sale")
	cmd.Flags().Bool("limits", false, "instead: check from every region's records that no buyer holds and bought more of a SKU than the sale's per-user limit")
	cmd.Flags().Bool("actions", false, "instead: verify the operators' action log's hash chain; exit 1 at the first row changed or removed")
	cmd.Flags().String("expect-head", "", "with --actions: the head an earlier check printed (SEQ:HASH), which must still be in the log")
	cmd.AddCommand(auditHistoryCmd())
	return cmd
}

type regionAuditJSON struct {
	Region     string `json:"region"`
	Available  int64  `json:"available"`
	Held       int64  `json:"held"`
	Sold       int64  `json:"sold"`
	CreditedIn int64  `json:"credited_in"`
	DebitedOut int64  `json:"debited_out"`
	Reachable  bool   `json:"reachable"`
	Error      string `json:"error,omitempty"`
}

type skuAuditJSON struct {
	Sale        string            `json:"sale"`
	SKU         string            `json:"sku"`
	OK          bool              `json:"ok"`
	Total       int64             `json:"total"`
	Unallocated int64             `json:"unallocated"`
	Available   int64             `json:"available"`
	Held        int64             `json:"held"`
	Sold        int64             `json:"sold"`
	InFlight    int64             `json:"in_flight"`
	Stranded    int64             `json:"stranded"`
	Regions     []regionAuditJSON `json:"regions"`
}

type violationJSON struct {
	Invariant string `json:"invariant"`
	Sale      string `json:"sale"`
	SKU       string `json:"sku"`
	Region    string `json:"region,omitempty"`
	Detail    string `json:"detail"`
}

type auditJSON struct {
	OK         bool            `json:"ok"`
	At         time.Time       `json:"at"`
	SKUs       []skuAuditJSON  `json:"skus"`
	Violations []violationJSON `json:"violations"`
	// Pauses are the audited sales' pauses in force: the continuous audit's have the
	// evidence in their reason ("audit: I1 violation: ...").
	Pauses []pauseJSON `json:"pauses"`
}

func toAuditJSON(r *quotav1.AuditResponse) auditJSON {
	out := auditJSON{OK: r.GetOk(), At: r.GetAt().AsTime(), SKUs: []skuAuditJSON{}, Violations: []violationJSON{}, Pauses: toPausesJSON(r.GetPauses())}
	for _, s := range r.GetSkus() {
		sa := skuAuditJSON{Sale: s.GetSaleId(), SKU: s.GetSku(), OK: s.GetOk(), Total: s.GetTotal(), Unallocated: s.GetUnallocated(),
			Available: s.GetAvailable(), Held: s.GetHeld(), Sold: s.GetSold(), InFlight: s.GetInFlight(), Stranded: s.GetStranded()}
		for _, g := range s.GetRegions() {
			sa.Regions = append(sa.Regions, regionAuditJSON{Region: g.GetRegion(), Available: g.GetAvailable(), Held: g.GetHeld(),
				Sold: g.GetSold(), CreditedIn: g.GetCreditedIn(), DebitedOut: g.GetDebitedOut(), Reachable: g.GetReachable(), Error: g.GetError()})
		}
		out.SKUs = append(out.SKUs, sa)
	}
	for _, v := range r.GetViolations() {
		out.Violations = append(out.Violations, violationJSON{Invariant: v.GetInvariant(), Sale: v.GetSaleId(), SKU: v.GetSku(),
			Region: v.GetRegion(), Detail: v.GetDetail()})
	}
	return out
}

func runAudit(e *env) error {
	if e.v.GetBool("limits") && e.v.GetBool("actions") {
		return usage("--limits and --actions: one check at a time")
	}
	if e.v.GetBool("limits") {
		return runAuditLimits(e)
	}
	if e.v.GetBool("actions") {
		return runAuditActions(e)
	}
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.Audit(e.ctx, &quotav1.AuditRequest{SaleId: e.v.GetString("sale")})
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	out := toAuditJSON(resp)
	if err := e.print(out, func(w io.Writer) { printAuditText(w, out) }); err != nil {
		return err
	}
	if !out.OK {
		return &exitError{code: 1}
	}
	return nil
}

func printAuditText(w io.Writer, a auditJSON) {
	for _, s := range a.SKUs {
		mark := "ok"
		if !s.OK {
			mark = "VIOLATED"
		}
		fmt.Fprintf(w, "%s/%s: I1 %s: total %d = unallocated %d + available %d + held %d + sold %d + in flight %d (stranded %d)\n",
			s.Sale, s.SKU, mark, s.Total, s.Unallocated, s.Available, s.Held, s.Sold, s.InFlight, s.Stranded)
		for _, r := range s.Regions {
			if !r.Reachable {
				fmt.Fprintf(w, "  %-6s unreachable: %s\n", r.Region, r.Error)
				continue
			}
			fmt.Fprintf(w, "  %-6s available %d, held %d, sold %d (credited in %d, debited out %d)\n",
				r.Region, r.Available, r.Held, r.Sold, r.CreditedIn, r.DebitedOut)
		}
	}
	for _, v := range a.Violations {
		where := v.Sale + "/" + v.SKU
		if v.Region != "" {
			where += " " + v.Region
		}
		fmt.Fprintf(w, "VIOLATION %s %s: %s\n", v.Invariant, where, v.Detail)
	}
	for _, p := range a.Pauses {
		printPause(w, "", p)
	}
	if a.OK {
		fmt.Fprintf(w, "audit ok: %d SKU(s), no violations\n", len(a.SKUs))
	} else {
		fmt.Fprintf(w, "audit FAILED: %d violation(s)\n", len(a.Violations))
	}
}

func regionsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "regions",
		Example: `  quotactl regions`,
		Short:   "List the regions the coordinator knows",
		Args:    cobra.NoArgs,
		RunE: withEnv(func(e *env) error {
			rs, err := e.regions()
			if err != nil {
				return err
			}
			type regionJSON struct {
				Name    string `json:"name"`
				Address string `json:"address"`
			}
			out := struct {
				Regions []regionJSON `json:"regions"`
			}{Regions: []regionJSON{}}
			for _, r := range rs {
				out.Regions = append(out.Regions, regionJSON{r.GetName(), r.GetAddress()})
			}
			return e.print(out, func(w io.Writer) {
				for _, r := range out.Regions {
					fmt.Fprintf(w, "%-8s %s\n", r.Name, r.Address)
				}
			})
		}),
	}
}
