-- +goose Up
-- The source's durable record of each outbound transfer. pending: units debited (counted
-- in debited_out, in flight until credited or restored). settled: the destination credited
-- them. voided: restored here (counted in credited_in). refused: the debit was refused
-- (not enough available); a tombstone, so a late retry of the same debit cannot apply.
CREATE TABLE transfers_out (
    transfer_id text PRIMARY KEY,
    sale_id     text   NOT NULL,
    sku         text   NOT NULL,
    to_pool     text   NOT NULL,
    units       bigint NOT NULL CHECK (units > 0),
    state       text   NOT NULL CHECK (state IN ('pending', 'settled', 'voided', 'refused')),
    generation  bigint NOT NULL,
    recorded_at timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE INDEX transfers_out_by_sale ON transfers_out (sale_id, sku);

-- +goose Down
DROP TABLE transfers_out;
