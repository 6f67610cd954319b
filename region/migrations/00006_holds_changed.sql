-- +goose Up
-- changed orders the writes to holds: every batch stamps the holds it inserts or closes with
-- one number, higher than any stored before it (region/standby.go). A warm standby reads only
-- the holds changed since the highest stamp it has seen (the index is migration 7, in
-- region/migrate.go). Rows written before this migration keep NULL: a standby's first load
-- reads every hold anyway. A new column with no default changes only the catalog, so the
-- table's lock is brief.
ALTER TABLE holds ADD COLUMN changed bigint;

-- +goose Down
ALTER TABLE holds DROP COLUMN changed;
