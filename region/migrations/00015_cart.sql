-- +goose Up
-- The cart a hold is a line of (region/cart.go): its line 0's hold id, or '' for a hold
-- reserved alone. Every line of a cart is written in one batch, all or nothing (I10); a
-- cart's confirm and release find its lines through these indexes, in holds and in the
-- archive alike.
ALTER TABLE holds ADD COLUMN cart_id text NOT NULL DEFAULT '';
ALTER TABLE holds_closed ADD COLUMN cart_id text NOT NULL DEFAULT '';
CREATE INDEX holds_by_cart ON holds (cart_id) WHERE cart_id <> '';
CREATE INDEX holds_closed_by_cart ON holds_closed (cart_id) WHERE cart_id <> '';

-- +goose Down
DROP INDEX holds_closed_by_cart;
DROP INDEX holds_by_cart;
ALTER TABLE holds_closed DROP COLUMN cart_id;
ALTER TABLE holds DROP COLUMN cart_id;
