package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/region/regionrpc"
	"github.com/spf13/cobra"
)

type holdJSON struct {
	HoldID     string    `json:"hold_id"`
	Region     string    `json:"region"`
	Sale       string    `json:"sale"`
	SKU        string    `json:"sku"`
	User       string    `json:"user"`
	Quantity   int64     `json:"quantity"`
	RequestKey string    `json:"request_key"`
	State      string    `json:"state"`
	ExpiresAt  time.Time `json:"expires_at"`
	PaymentID  string    `json:"payment_id,omitempty"`
	CartID     string    `json:"cart_id,omitempty"`
	Replayed   bool      `json:"replayed,omitempty"`
	Outcome    string    `json:"outcome,omitempty"`
	Reason     string    `json:"reason,omitempty"`
}

// toHoldJSON is a reservation as quotactl prints it; its state has the name every client
// sees, read back through the region adapter's one table (regionrpc.HoldStateOf).
func toHoldJSON(r *quotav1.Reservation) holdJSON {
	return holdJSON{HoldID: r.GetHoldId(), Region: r.GetRegion(), Sale: r.GetSaleId(), SKU: r.GetSku(), User: r.GetUserId(),
		Quantity: r.GetQuantity(), RequestKey: r.GetRequestKey(), State: regionrpc.HoldStateOf(r.GetState()).String(),
		ExpiresAt: r.GetExpiresAt().AsTime(), PaymentID: r.GetPaymentId(), CartID: r.GetCartId()}
}

// cartJSON is a cart as quotactl prints it: its id, its holds (one per line) and, for a
// confirm, the outcome.
type cartJSON struct {
	CartID   string     `json:"cart_id"`
	Holds    []holdJSON `json:"holds"`
	Replayed bool       `json:"replayed,omitempty"`
	Outcome  string     `json:"outcome,omitempty"`
	Reason   string     `json:"reason,omitempty"`
}

func printCart(e *env, id string, rs []*quotav1.Reservation, c cartJSON) error {
	c.CartID = id
	for _, r := range rs {
		c.Holds = append(c.Holds, toHoldJSON(r))
	}
	return e.print(c, func(w io.Writer) {
		fmt.Fprintf(w, "cart %s: %d lines", c.CartID, len(c.Holds))
		if c.Replayed {
			fmt.Fprint(w, " (replayed)")
		}
		fmt.Fprintln(w)
		for _, h := range c.Holds {
			fmt.Fprintf(w, "  hold %s (%s): %d × %s for %s, %s\n", h.HoldID, h.Region, h.Quantity, h.SKU, h.User, h.State)
		}
		if c.Outcome != "" {
			fmt.Fprintf(w, "%s", c.Outcome)
			if c.Reason != "" {
				fmt.Fprintf(w, ": %s", c.Reason)
			}
			fmt.Fprintln(w)
		}
	})
}

// cartLines reads --sku as a cart's lines when it names quantities (phone=1,case=1), or
// nil for one SKU.
func cartLines(sku string) ([]*quotav1.CartLine, error) {
	if !strings.Contains(sku, "=") {
		return nil, nil
	}
	names, nums, err := parsePairs("sku", []string{sku})
	if err != nil {
		return nil, err
	}
	lines := make([]*quotav1.CartLine, len(names))
	for i, n := range names {
		lines[i] = &quotav1.CartLine{Sku: n, Quantity: nums[i]}
	}
	return lines, nil
}

func printHold(e *env, h holdJSON) error {
	return e.print(h, func(w io.Writer) {
		fmt.Fprintf(w, "hold %s (%s): %d × %s of sale %s for %s, %s", h.HoldID, h.Region, h.Quantity, h.SKU, h.Sale, h.User, h.State)
		if h.State == region.Held.String() {
			fmt.Fprintf(w, " until %s", h.ExpiresAt.Format(time.RFC3339))
		}
		if h.PaymentID != "" {
			fmt.Fprintf(w, ", payment %s", h.PaymentID)
		}
		if h.Replayed {
			fmt.Fprint(w, " (replayed)")
		}
		if h.Reason != "" {
			fmt.Fprintf(w, "\n%s: %s", h.Outcome, h.Reason)
		}
		fmt.Fprintln(w)
	})
}

func reserveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reserve",
		Short: "Reserve units at a region (a hold that waits for payment)",
		Long: `Reserve units at a region (a hold that waits for payment). A --sku of SKU=quantity
pairs reserves a cart: every line held (one hold per line, sharing a cart id) or none.`,
		Example: `  quotactl reserve --region us --sale launch --sku phone --user alice --quantity 1 --request-key checkout-1
  quotactl reserve --region us --sale launch --sku phone=1,case=1 --user alice --request-key cart-1`,
		Args: cobra.NoArgs,
		RunE: withRegion(func(e *env, rc quotav1.RegionServiceClient) error {
			lines, err := cartLines(e.v.GetString("sku"))
			if err != nil {
				return err
			}
			if lines != nil {
				resp, err := rc.Reserve(e.ctx, &quotav1.ReserveRequest{SaleId: e.v.GetString("sale"), UserId: e.v.GetString("user"),
					RequestKey: e.v.GetString("request-key"), Lines: lines})
				if err != nil {
					return fmt.Errorf("reserve: %w", err)
				}
				return printCart(e, resp.GetCartId(), resp.GetReservations(), cartJSON{Replayed: resp.GetReplayed()})
			}
			resp, err := rc.Reserve(e.ctx, &quotav1.ReserveRequest{SaleId: e.v.GetString("sale"), Sku: e.v.GetString("sku"),
				UserId: e.v.GetString("user"), Quantity: e.v.GetInt64("quantity"), RequestKey: e.v.GetString("request-key")})
			if err != nil {
				return fmt.Errorf("reserve: %w", err)
			}
			h := toHoldJSON(resp.GetReservation())
			h.Replayed = resp.GetReplayed()
			return printHold(e, h)
		}),
	}
	f := cmd.Flags()
	f.String("region", "", "region to reserve at (required)")
	f.String("sale", "", "sale id (required)")
	f.String("sku", "", "SKU (required), or a cart's lines as SKU=quantity pairs (phone=1,case=1)")
	f.String("user", "", "user id (required)")
	f.Int64("quantity", 1, "units")
	f.String("request-key", "", "the request key, which makes the call idempotent (required): retrying with the same key at the same region returns the same hold")
	cliconf.Alias(f, "key", "request-key")
	return cmd
}

// holdOrCart checks confirm's and release's target: --hold or --cart, exactly one.
func holdOrCart(e *env) error {
	hold, cart := e.v.GetString("hold"), e.v.GetString("cart")
	switch {
	case hold == "" && cart == "":
		return usage("--hold: required, unless --cart (see %s --help)", e.cmd.CommandPath())
	case hold != "" && cart != "":
		return usage("--hold and --cart: give one of them, not both")
	}
	return nil
}

// withRegion runs fn with the settings and a client of the region named by --region.
func withRegion(fn func(e *env, rc quotav1.RegionServiceClient) error) func(*cobra.Command, []string) error {
	return withEnv(func(e *env) error {
		rc, err := e.region(e.v.GetString("region"))
		if err != nil {
			return err
		}
		return fn(e, rc)
	})
}

func holdFlags(cmd *cobra.Command) {
	cmd.Flags().String("region", "", "region holding the reservation (required)")
	cmd.Flags().String("hold", "", "hold id (required)")
}

// holdOrCartFlags are confirm's and release's: --hold, or --cart, a cart's id in its place.
func holdOrCartFlags(cmd *cobra.Command) {
	cmd.Flags().String("region", "", "region holding the reservation (required)")
	cmd.Flags().String("hold", "", "hold id (required, unless --cart)")
	cmd.Flags().String("cart", "", "a cart's id, in place of --hold: every line of the cart at once")
}

func confirmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "confirm",
		Example: `  quotactl confirm --region us --hold us.019ad3f2c4e1a8b7c6d5e4f3a2b1 --payment pay-8841`,
		Short:   "Record payment for a hold: sold, or refund when the hold is no longer live",
		Args:    cobra.NoArgs,
		RunE: withRegion(func(e *env, rc quotav1.RegionServiceClient) error {
			if err := holdOrCart(e); err != nil {
				return err
			}
			resp, err := rc.Confirm(e.ctx, &quotav1.ConfirmRequest{HoldId: e.v.GetString("hold"), CartId: e.v.GetString("cart"),
				PaymentId: e.v.GetString("payment")})
			if err != nil {
				return fmt.Errorf("confirm: %w", err)
			}
			if id := e.v.GetString("cart"); id != "" {
				c := cartJSON{Outcome: "sold", Reason: resp.GetReason()}
				if resp.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_REFUND {
					c.Outcome = "refund"
				}
				return printCart(e, id, resp.GetReservations(), c)
			}
			h := toHoldJSON(resp.GetReservation())
			h.Outcome, h.Reason = "sold", resp.GetReason()
			if resp.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_REFUND {
				h.Outcome = "refund"
			}
			return printHold(e, h)
		}),
	}
	holdOrCartFlags(cmd)
	cmd.Flags().String("payment", "", "payment id (required)")
	return cmd
}

func releaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "release",
		Example: `  quotactl release --region us --hold us.019ad3f2c4e1a8b7c6d5e4f3a2b1`,
		Short:   "Give a hold's units back to its region's pool",
		Args:    cobra.NoArgs,
		RunE: withRegion(func(e *env, rc quotav1.RegionServiceClient) error {
			if err := holdOrCart(e); err != nil {
				return err
			}
			resp, err := rc.Release(e.ctx, &quotav1.ReleaseRequest{HoldId: e.v.GetString("hold"), CartId: e.v.GetString("cart")})
			if err != nil {
				return fmt.Errorf("release: %w", err)
			}
			if id := e.v.GetString("cart"); id != "" {
				return printCart(e, id, resp.GetReservations(), cartJSON{})
			}
			return printHold(e, toHoldJSON(resp.GetReservation()))
		}),
	}
	holdOrCartFlags(cmd)
	return cmd
}

func holdCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "hold",
		Example: `  quotactl hold --region us --hold us.019ad3f2c4e1a8b7c6d5e4f3a2b1 -o json`,
		Short:   "Show one hold (GetReservation)",
		Args:    cobra.NoArgs,
		RunE: withRegion(func(e *env, rc quotav1.RegionServiceClient) error {
			resp, err := rc.GetReservation(e.ctx, &quotav1.GetReservationRequest{HoldId: e.v.GetString("hold")})
			if err != nil {
				return fmt.Errorf("get reservation: %w", err)
			}
			return printHold(e, toHoldJSON(resp.GetReservation()))
		}),
	}
	holdFlags(cmd)
	return cmd
}

func holdsCmd() *cobra.Command {
	return group("holds", "List a buyer's holds", holdsListCmd())
}

func holdsListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "list",
		Example: `  quotactl holds list --region us --sale launch --user alice
  quotactl holds list --region us --sale launch --user alice --limit 10 -o json`,
		Short: "List one buyer's holds of a sale at a region, open and closed, newest first (ListBuyerHolds)",
		Args:  cobra.NoArgs,
		RunE: withRegion(func(e *env, rc quotav1.RegionServiceClient) error {
			resp, err := rc.ListBuyerHolds(e.ctx, &quotav1.ListBuyerHoldsRequest{SaleId: e.v.GetString("sale"),
				UserId: e.v.GetString("user"), Limit: e.v.GetInt32("limit")})
			if err != nil {
				return fmt.Errorf("list holds: %w", err)
			}
			out := struct {
				Holds     []holdJSON `json:"holds"`
				Truncated bool       `json:"truncated"`
			}{Holds: []holdJSON{}, Truncated: resp.GetTruncated()}
			for _, r := range resp.GetReservations() {
				out.Holds = append(out.Holds, toHoldJSON(r))
			}
			return e.print(out, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "HOLD\tSKU\tQUANTITY\tSTATE\tEXPIRES\tPAYMENT\tREQUEST KEY")
				for _, h := range out.Holds {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", h.HoldID, h.SKU, h.Quantity, h.State,
						h.ExpiresAt.Format(time.RFC3339), h.PaymentID, h.RequestKey)
				}
				tw.Flush()
				if out.Truncated {
					fmt.Fprintf(w, "(more holds than --limit %d: the newest are listed)\n", e.v.GetInt32("limit"))
				}
			})
		}),
	}
	f := cmd.Flags()
	f.String("region", "", "region to ask (required): a buyer's holds are at the region they reserved at")
	f.String("sale", "", "sale id (required)")
	f.String("user", "", "user id (required)")
	f.Int32("limit", region.DefaultBuyerHolds, fmt.Sprintf("how many holds at most, newest first (1..%d)", region.MaxBuyerHolds))
	return cmd
}
