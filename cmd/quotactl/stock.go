package main

import (
	"fmt"
	"io"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func stockCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "stock",
		Example: `  quotactl stock --sale launch
  quotactl stock --sale launch --region us -o json`,
		Short: "Show every region's pools of a sale (available, held, sold)",
		Args:  cobra.NoArgs,
		RunE:  withEnv(runStock),
	}
	cmd.Flags().String("sale", "", "sale id (required)")
	cmd.Flags().String("region", "", "only this region")
	return cmd
}

type poolJSON struct {
	Region    string `json:"region"`
	SKU       string `json:"sku"`
	Available int64  `json:"available"`
	Held      int64  `json:"held"`
	Sold      int64  `json:"sold"`
}

type stockJSON struct {
	Sale   string     `json:"sale"`
	Pools  []poolJSON `json:"pools"`
	Errors []string   `json:"errors,omitempty"`
}

func runStock(e *env) error {
	sale := e.v.GetString("sale")
	rs, err := e.onlyRegion(e.v.GetString("region"))
	if err != nil {
		return err
	}
	out := stockJSON{Sale: sale, Pools: []poolJSON{}}
	missing := 0
	for _, r := range rs {
		conn, err := e.dial(r.GetAddress())
		if err != nil {
			return err
		}
		resp, err := quotav1.NewRegionServiceClient(conn).GetStock(e.ctx, &quotav1.GetStockRequest{SaleId: sale})
		if status.Code(err) == codes.NotFound {
			missing++ // a region the sale never gave units to has no pools of it
			continue
		}
		if err != nil {
			out.Errors = append(out.Errors, fmt.Sprintf("region %s: %s", r.GetName(), describe(err)))
			continue
		}
		for _, p := range resp.GetPools() {
			out.Pools = append(out.Pools, poolJSON{Region: p.GetRegion(), SKU: p.GetSku(), Available: p.GetAvailable(), Held: p.GetHeld(), Sold: p.GetSold()})
		}
	}
	if missing == len(rs) {
		return fmt.Errorf("sale %q: no region has pools of it (unknown sale, or its stock is not allocated yet)", sale)
	}
	if err := e.print(out, func(w io.Writer) {
		fmt.Fprintf(w, "%-8s %-16s %10s %10s %10s\n", "REGION", "SKU", "AVAILABLE", "HELD", "SOLD")
		for _, p := range out.Pools {
			fmt.Fprintf(w, "%-8s %-16s %10d %10d %10d\n", p.Region, p.SKU, p.Available, p.Held, p.Sold)
		}
		for _, m := range out.Errors {
			fmt.Fprintln(e.cmd.ErrOrStderr(), "error:", m)
		}
	}); err != nil {
		return err
	}
	if len(out.Errors) > 0 {
		return &exitError{code: 1}
	}
	return nil
}
