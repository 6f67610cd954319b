-- +goose Up
-- The archive of closed holds (region/archive.go). A closed hold (sold, released, expired)
-- never changes again: once it has been closed for the leader's retention it is moved here
-- from holds, in bounded batches, in the transaction that deletes it from holds, so a
-- takeover (which reads holds) and the hot path's indexes no longer grow with the history.
-- archived is the stamp of the batch that moved it (as holds.changed: a warm standby reads the
-- holds archived since its last refresh through holds_closed_by_archived).
CREATE TABLE holds_closed (
    hold_id      text PRIMARY KEY,
    sale_id      text NOT NULL,
    sku          text NOT NULL,
    user_id      text NOT NULL,
    quantity     bigint NOT NULL CHECK (quantity > 0),
    request_key  text NOT NULL,
    request_hash text NOT NULL,
    state        text NOT NULL CHECK (state IN ('sold', 'released', 'expired')),
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    closed_at    timestamptz,
    payment_id   text,
    admission_id text NOT NULL DEFAULT '',
    changed      bigint,
    archived     bigint NOT NULL,
    CONSTRAINT holds_closed_idempotency UNIQUE (sale_id, user_id, request_key),
    CONSTRAINT holds_closed_sold_has_payment CHECK ((state = 'sold') = (payment_id IS NOT NULL))
);
CREATE INDEX holds_closed_by_archived ON holds_closed (archived);
CREATE INDEX holds_closed_by_pool ON holds_closed (sale_id, sku, state);

-- Per buyer and SKU of a sale, the archived holds (request keys used) and their sold units,
-- kept in the archiving transaction: a leader reads one buyer's row when it first needs the
-- buyer's counts (I2), not every archived hold.
CREATE TABLE archived_users (
    sale_id text   NOT NULL,
    user_id text   NOT NULL,
    sku     text   NOT NULL,
    holds   bigint NOT NULL CHECK (holds > 0),
    sold    bigint NOT NULL CHECK (sold >= 0),
    PRIMARY KEY (sale_id, user_id, sku)
);

-- Per pool, the archived holds and their sold units: a takeover reads this small table to
-- know which sales have an archive (and how much of a pool's sold units it holds).
CREATE TABLE archived_pools (
    sale_id text   NOT NULL,
    sku     text   NOT NULL,
    holds   bigint NOT NULL CHECK (holds > 0),
    sold    bigint NOT NULL CHECK (sold >= 0),
    PRIMARY KEY (sale_id, sku)
);

-- The archiver finds the oldest closed holds through this index, never by reading holds.
CREATE INDEX holds_closed_at ON holds (closed_at) WHERE state <> 'held';

-- +goose Down
DROP INDEX holds_closed_at;
INSERT INTO holds (hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at, closed_at,
    payment_id, admission_id, changed)
SELECT hold_id, sale_id, sku, user_id, quantity, request_key, request_hash, state, created_at, expires_at, closed_at,
    payment_id, admission_id, changed FROM holds_closed;
DROP TABLE archived_pools;
DROP TABLE archived_users;
DROP TABLE holds_closed;
