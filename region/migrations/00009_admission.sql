-- +goose Up
-- A sale's waiting room (admit_rate buyers per second, 0: none), as the coordinator published
-- it, and the admission each hold was made with: an admission's ticket backs at most one
-- request key, so no two holds of a sale share an admission (the writer checks it in memory
-- first; this index is the durable record of it).
ALTER TABLE sales
    ADD COLUMN admit_rate       bigint NOT NULL DEFAULT 0 CHECK (admit_rate >= 0),
    ADD COLUMN ticket_ttl_ms    bigint NOT NULL DEFAULT 0 CHECK (ticket_ttl_ms >= 0),
    ADD COLUMN max_live_tickets bigint NOT NULL DEFAULT 0 CHECK (max_live_tickets >= 0);
ALTER TABLE holds ADD COLUMN admission_id text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX holds_admission ON holds (sale_id, admission_id) WHERE admission_id <> '';

-- +goose Down
DROP INDEX holds_admission;
ALTER TABLE holds DROP COLUMN admission_id;
ALTER TABLE sales DROP COLUMN admit_rate, DROP COLUMN ticket_ttl_ms, DROP COLUMN max_live_tickets;
