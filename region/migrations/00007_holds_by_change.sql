-- +goose NO TRANSACTION
-- +goose Up
-- The index a warm standby reads the holds changed since its last refresh through. Stamps
-- rise, so its entries go in at its right edge. Built CONCURRENTLY, outside a transaction, so
-- that a leader serving from the same database during a rolling upgrade is not held up for
-- the whole build. A build that failed leaves an invalid index of this name: drop it and
-- start the process again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS holds_by_change ON holds (changed);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS holds_by_change;
