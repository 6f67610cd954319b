-- +goose Up
-- Expiry is found in the leader's memory (a heap of deadlines), not by a query: the index on
-- (state, expires_at) only cost every hold insert and close an index update.
DROP INDEX holds_by_state_expiry;

-- +goose Down
CREATE INDEX holds_by_state_expiry ON holds (state, expires_at);
