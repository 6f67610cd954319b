-- +goose Up
-- changed orders the writes to holds: every batch stamps the holds it inserts or closes with
-- one number, higher than any stored before it (region/standby.go). A warm standby reads only
-- the holds changed since the highest stamp it has seen, through this index; stamps rise, so
-- its entries go in at the index's right edge. Rows written before this migration keep NULL:
-- a standby's first load reads every hold anyway.
ALTER TABLE holds ADD COLUMN changed bigint;
CREATE INDEX holds_by_change ON holds (changed);

-- +goose Down
DROP INDEX holds_by_change;
ALTER TABLE holds DROP COLUMN changed;
