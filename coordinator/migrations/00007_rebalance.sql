-- +goose Up
-- Whether the automatic rebalancer moves a sale's stock ('auto', the default) or leaves it to
-- operators ('manual').
ALTER TABLE sales ADD COLUMN rebalance text NOT NULL DEFAULT 'auto' CHECK (rebalance IN ('auto', 'manual'));

-- +goose Down
ALTER TABLE sales DROP COLUMN rebalance;
