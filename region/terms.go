package region

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

func readTerms(ctx context.Context, q rowQuerier, sale string) (SaleTerms, error) {
	t := SaleTerms{Sale: sale}
	var limit, ttl, ticketTTL int64
	err := q.QueryRow(ctx, `SELECT skus, per_user_limit, hold_ttl_ms, opens_at, admit_rate, ticket_ttl_ms, max_live_tickets, room_return_url
		FROM sales WHERE sale_id = $1`, sale).Scan(&t.SKUs, &limit, &ttl, &t.OpensAt, &t.Admission.Rate, &ticketTTL, &t.Admission.MaxLive,
		&t.Admission.ReturnURL)
	if err == pgx.ErrNoRows {
		return t, fmt.Errorf("sale_id %q: %w", sale, ErrNotFound)
	}
	if err != nil {
		return t, fmt.Errorf("read sale: %w", err)
	}
	t.PerUserLimit, t.HoldTTL = transfer.Units(limit), time.Duration(ttl)*time.Millisecond
	t.Admission.TicketTTL = time.Duration(ticketTTL) * time.Millisecond
	return t, nil
}
