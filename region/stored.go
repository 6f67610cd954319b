package region

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/transfer"
)

// rowQuerier is what a one-row read needs: a pool, a connection or a transaction.
type rowQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

const holdColumns = `hold_id, sale_id, sku, user_id, quantity, request_key, state, created_at, expires_at, coalesce(payment_id, ''), admission_id, cart_id`

// scanHold reads holdColumns, then any further columns into extra.
func scanHold(row pgx.Row, region string, extra ...any) (Hold, error) {
	h := Hold{Region: region}
	var q int64
	var st string
	dest := append([]any{&h.ID, &h.Sale, &h.SKU, &h.User, &q, &h.RequestKey, &st, &h.CreatedAt, &h.ExpiresAt, &h.PaymentID, &h.Admission, &h.CartID}, extra...)
	err := row.Scan(dest...)
	h.Quantity, h.State = transfer.Units(q), HoldState(st)
	return h, err
}
