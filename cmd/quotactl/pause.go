package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/spf13/cobra"
)

func salePauseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pause",
		Short: "Stop every region admitting new reservations of a sale (or of one SKU); confirms and releases go on",
		Long: `pause is the kill switch: every region stops granting new holds of the sale (with --sku, of that
SKU alone) and answers Reserve with PAUSED, while Confirm, Release and expiry of the holds
already made go on. The coordinator records the pause in its ledger, then returns once every
region it could reach has recorded it in its own database (so it holds across restarts and
failovers); a region it could not reach is listed, the exit status is 1, and the coordinator
keeps trying it every second. Running the command again is safe and delivers what is missing.`,
		Example: `  quotactl sale pause --sale launch --reason "price error"
  quotactl sale pause --sale launch --sku phone -o json`,
		Args: cobra.NoArgs,
		RunE: withEnv(runSalePause),
	}
	f := cmd.Flags()
	f.String("sale", "", "sale id (required)")
	f.String("sku", "", "pause only this SKU; default the whole sale")
	f.String("reason", "", "why, for the operators and in the message of every refused Reserve (at most 1024 bytes)")
	return cmd
}

func saleResumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "resume",
		Short: "Let the regions admit new reservations of a paused sale (or SKU) again",
		Long: `resume lifts pauses: without --sku, the sale's and every one of its SKUs' (those the continuous
audit made too); with --sku, that SKU's alone, so a pause of the whole sale still holds it.
Delivered and reported as pause is. A SKU whose conservation (I1) is still broken is paused
again by the continuous audit's next round.`,
		Example: `  quotactl sale resume --sale launch
  quotactl sale resume --sale launch --sku phone -o json`,
		Args: cobra.NoArgs,
		RunE: withEnv(runSaleResume),
	}
	f := cmd.Flags()
	f.String("sale", "", "sale id (required)")
	f.String("sku", "", "resume only this SKU; default the whole sale and all its SKUs")
	return cmd
}

type pauseJSON struct {
	Sale        string    `json:"sale"`
	SKU         string    `json:"sku,omitempty"`
	Paused      bool      `json:"paused"`
	Reason      string    `json:"reason,omitempty"`
	ChangedAt   time.Time `json:"changed_at"`
	Version     int64     `json:"version"`
	Undelivered []string  `json:"undelivered,omitempty"`
}

type regionFailureJSON struct {
	Region string `json:"region"`
	Error  string `json:"error"`
}

type pauseResultJSON struct {
	Sale      string              `json:"sale"`
	SKU       string              `json:"sku,omitempty"`
	Paused    bool                `json:"paused"`
	Reached   []string            `json:"reached"`
	Unreached []regionFailureJSON `json:"unreached"`
	Pauses    []pauseJSON         `json:"pauses"`
}

func toPauseJSON(p *quotav1.Pause) pauseJSON {
	return pauseJSON{Sale: p.GetSaleId(), SKU: p.GetSku(), Paused: p.GetPaused(), Reason: p.GetReason(),
		ChangedAt: p.GetChangedAt().AsTime(), Version: p.GetVersion(), Undelivered: p.GetUndelivered()}
}

func toPausesJSON(ps []*quotav1.Pause) []pauseJSON {
	out := []pauseJSON{}
	for _, p := range ps {
		out = append(out, toPauseJSON(p))
	}
	return out
}

// pauseWhat names what a pause covers: one SKU, or the whole sale.
func pauseWhat(sale, sku string) string {
	if sku == "" {
		return "sale " + sale
	}
	return "sku " + sku + " of sale " + sale
}

// printPause is one pause's line of text: what it covers, since when, why, and the regions
// that do not have it yet.
func printPause(w io.Writer, indent string, p pauseJSON) {
	state := "PAUSED"
	if !p.Paused {
		state = "resumed"
	}
	fmt.Fprintf(w, "%s%s %s since %s", indent, pauseWhat(p.Sale, p.SKU), state, p.ChangedAt.Format(time.RFC3339))
	if p.Reason != "" {
		fmt.Fprintf(w, ": %s", p.Reason)
	}
	if len(p.Undelivered) > 0 {
		fmt.Fprintf(w, " (not yet at %s)", strings.Join(p.Undelivered, ", "))
	}
	fmt.Fprintln(w)
}

func runSalePause(e *env) error {
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	req := &quotav1.PauseSaleRequest{SaleId: e.v.GetString("sale"), Sku: e.v.GetString("sku"), Reason: e.v.GetString("reason")}
	resp, err := c.PauseSale(e.ctx, req)
	if err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	return printPauseResult(e, pauseResultJSON{Sale: req.GetSaleId(), SKU: req.GetSku(), Paused: true}, resp.GetSale(),
		resp.GetReached(), resp.GetUnreached())
}

func runSaleResume(e *env) error {
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	req := &quotav1.ResumeSaleRequest{SaleId: e.v.GetString("sale"), Sku: e.v.GetString("sku")}
	resp, err := c.ResumeSale(e.ctx, req)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return printPauseResult(e, pauseResultJSON{Sale: req.GetSaleId(), SKU: req.GetSku()}, resp.GetSale(),
		resp.GetReached(), resp.GetUnreached())
}

// printPauseResult prints a pause's or resume's outcome; regions not reached make it exit 1
// after printing, as they do not have the change yet.
func printPauseResult(e *env, out pauseResultJSON, sale *quotav1.Sale, reached []string, unreached []*quotav1.RegionFailure) error {
	out.Reached, out.Unreached, out.Pauses = append([]string{}, reached...), []regionFailureJSON{}, toPausesJSON(sale.GetPauses())
	for _, u := range unreached {
		out.Unreached = append(out.Unreached, regionFailureJSON{Region: u.GetRegion(), Error: u.GetError()})
	}
	err := e.print(out, func(w io.Writer) {
		verb := "resumed"
		if out.Paused {
			verb = "paused"
		}
		fmt.Fprintf(w, "%s %s in %s\n", pauseWhat(out.Sale, out.SKU), verb, orNone(out.Reached))
		for _, u := range out.Unreached {
			fmt.Fprintf(w, "  NOT REACHED %s: %s\n", u.Region, u.Error)
		}
		if len(out.Pauses) == 0 {
			fmt.Fprintf(w, "sale %s: nothing paused\n", out.Sale)
		}
		for _, p := range out.Pauses {
			printPause(w, "", p)
		}
	})
	if err != nil || len(out.Unreached) == 0 {
		return err
	}
	names := make([]string, len(out.Unreached))
	for i, u := range out.Unreached {
		names[i] = u.Region
	}
	return &exitError{code: 1, err: fmt.Errorf("not every region has it yet: %s; the coordinator keeps trying every second (run the command again to wait for them)",
		strings.Join(names, ", "))}
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "no region"
	}
	return strings.Join(names, ", ")
}
