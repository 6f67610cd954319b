package main

import (
	"fmt"
	"io"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/spf13/cobra"
)

func paymentsCmd() *cobra.Command {
	late := &cobra.Command{
		Use:     "late",
		Example: `  quotactl payments late --sale launch -o json`,
		Short:   "List the late payments to refund, from every region, with the hold and the reason",
		Long: `late lists the payments every region received for a hold no longer live (expired or
released when the Confirm came): the storefront was answered REFUND, and finance refunds from
this list. The coordinator reads each region's database directly, so a stopped region process
does not block it; a region whose database cannot be read is named, and the exit status is 1.
At most --limit payments per region, oldest first.`,
		Args: cobra.NoArgs,
		RunE: withEnv(runLatePayments),
	}
	late.Flags().String("sale", "", "only this sale's")
	late.Flags().Int("limit", 1000, "the most listed per region (1..10000)")
	return group("payments", "Payments the regions recorded", late)
}

type latePaymentJSON struct {
	Region     string    `json:"region"`
	HoldID     string    `json:"hold_id"`
	PaymentID  string    `json:"payment_id"`
	HoldState  string    `json:"hold_state"`
	Reason     string    `json:"reason"`
	ReceivedAt time.Time `json:"received_at"`
	Sale       string    `json:"sale"`
	SKU        string    `json:"sku"`
	User       string    `json:"user"`
	Quantity   int64     `json:"quantity"`
	ExpiresAt  time.Time `json:"expires_at,omitzero"`
	ClosedAt   time.Time `json:"closed_at,omitzero"`
}

type latePaymentsJSON struct {
	Payments   []latePaymentJSON `json:"payments"`
	Truncated  []string          `json:"truncated"`
	Unreadable []failureJSON     `json:"unreadable"`
}

func runLatePayments(e *env) error {
	limit := e.v.GetInt("limit")
	if limit < 1 || limit > 10000 {
		return usage("--limit %d: must be 1..10000", limit)
	}
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.ListLatePayments(e.ctx, &quotav1.ListLatePaymentsRequest{SaleId: e.v.GetString("sale"), Limit: int32(limit)})
	if err != nil {
		return fmt.Errorf("late payments: %w", err)
	}
	out := latePaymentsJSON{Payments: []latePaymentJSON{}, Truncated: append([]string{}, resp.GetTruncated()...),
		Unreadable: toFailuresJSON(resp.GetUnreadable())}
	for _, l := range resp.GetPayments() {
		p := latePaymentJSON{Region: l.GetRegion(), HoldID: l.GetHoldId(), PaymentID: l.GetPaymentId(), HoldState: l.GetHoldState(),
			Reason: l.GetReason(), ReceivedAt: l.GetReceivedAt().AsTime(), Sale: l.GetSaleId(), SKU: l.GetSku(), User: l.GetUserId(),
			Quantity: l.GetQuantity()}
		if l.GetExpiresAt() != nil {
			p.ExpiresAt = l.GetExpiresAt().AsTime()
		}
		if l.GetClosedAt() != nil {
			p.ClosedAt = l.GetClosedAt().AsTime()
		}
		out.Payments = append(out.Payments, p)
	}
	if err := e.print(out, func(w io.Writer) { printLateText(w, out) }); err != nil {
		return err
	}
	if len(out.Unreadable) > 0 {
		return &exitError{code: 1}
	}
	return nil
}

func printLateText(w io.Writer, l latePaymentsJSON) {
	for _, p := range l.Payments {
		fmt.Fprintf(w, "%s %-4s REFUND payment %s of hold %s (%s/%s, buyer %s, %d unit(s)): %s\n", p.ReceivedAt.Format(time.RFC3339),
			p.Region, p.PaymentID, p.HoldID, p.Sale, p.SKU, p.User, p.Quantity, p.Reason)
	}
	for _, r := range l.Truncated {
		fmt.Fprintf(w, "region %s has more: raise --limit\n", r)
	}
	for _, f := range l.Unreadable {
		fmt.Fprintf(w, "UNREADABLE %s: %s\n", f.Region, f.Error)
	}
	fmt.Fprintf(w, "%d late payment(s) to refund\n", len(l.Payments))
}
