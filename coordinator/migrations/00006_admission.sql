-- +goose Up
-- A sale's waiting room at each region (admit_rate buyers per second, 0: none), the life of
-- the tickets it issues and how many may be live at once; published to the regions with the
-- other terms.
ALTER TABLE sales
    ADD COLUMN admit_rate       bigint NOT NULL DEFAULT 0 CHECK (admit_rate >= 0),
    ADD COLUMN ticket_ttl_ms    bigint NOT NULL DEFAULT 0 CHECK (ticket_ttl_ms >= 0),
    ADD COLUMN max_live_tickets bigint NOT NULL DEFAULT 0 CHECK (max_live_tickets >= 0);

-- +goose Down
ALTER TABLE sales DROP COLUMN admit_rate, DROP COLUMN ticket_ttl_ms, DROP COLUMN max_live_tickets;
