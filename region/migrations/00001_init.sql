-- +goose Up
-- A region's durable state. Every count is non-negative (I2) and every pool's books
-- balance (I3) by CHECK constraint, so a bug that would break them aborts its transaction.

CREATE TABLE leader_epoch (
    id    int PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL CHECK (epoch >= 0)
);
INSERT INTO leader_epoch (id, epoch) VALUES (1, 0);

CREATE TABLE sale_fences (
    sale_id    text PRIMARY KEY,
    generation bigint NOT NULL CHECK (generation > 0)
);

CREATE TABLE sales (
    sale_id        text PRIMARY KEY,
    skus           text[] NOT NULL,
    per_user_limit bigint NOT NULL CHECK (per_user_limit > 0),
    hold_ttl_ms    bigint NOT NULL CHECK (hold_ttl_ms > 0),
    opens_at       timestamptz NOT NULL
);

CREATE TABLE pools (
    sale_id     text   NOT NULL,
    sku         text   NOT NULL,
    available   bigint NOT NULL CHECK (available >= 0),
    held        bigint NOT NULL CHECK (held >= 0),
    sold        bigint NOT NULL CHECK (sold >= 0),
    credited_in bigint NOT NULL CHECK (credited_in >= 0),
    debited_out bigint NOT NULL CHECK (debited_out >= 0),
    PRIMARY KEY (sale_id, sku),
    CONSTRAINT i3_region_books CHECK (credited_in - debited_out = available + held + sold)
);

CREATE TABLE holds (
    hold_id      text PRIMARY KEY,
    sale_id      text NOT NULL,
    sku          text NOT NULL,
    user_id      text NOT NULL,
    quantity     bigint NOT NULL CHECK (quantity > 0),
    request_key  text NOT NULL,
    request_hash text NOT NULL,
    state        text NOT NULL CHECK (state IN ('held', 'sold', 'released', 'expired')),
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    closed_at    timestamptz,
    payment_id   text,
    CONSTRAINT holds_idempotency UNIQUE (sale_id, user_id, request_key),
    CONSTRAINT i5_sold_has_payment CHECK ((state = 'sold') = (payment_id IS NOT NULL))
);
CREATE INDEX holds_by_state_expiry ON holds (state, expires_at);
CREATE INDEX holds_by_pool ON holds (sale_id, sku, state);

CREATE TABLE user_counts (
    sale_id    text   NOT NULL,
    sku        text   NOT NULL,
    user_id    text   NOT NULL,
    held_qty   bigint NOT NULL CHECK (held_qty >= 0),
    bought_qty bigint NOT NULL CHECK (bought_qty >= 0),
    PRIMARY KEY (sale_id, sku, user_id)
);

-- Payments that arrived for a hold no longer live: the storefront was told to refund;
-- finance reconciles from here.
CREATE TABLE late_payments (
    hold_id     text NOT NULL,
    payment_id  text NOT NULL,
    hold_state  text NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (hold_id, payment_id)
);

-- The destination's durable record of each inbound transfer (I5: credited once; a refused
-- tombstone makes any later credit fail).
CREATE TABLE transfers_in (
    transfer_id text PRIMARY KEY,
    sale_id     text   NOT NULL,
    sku         text   NOT NULL,
    units       bigint NOT NULL CHECK (units >= 0),
    state       text   NOT NULL CHECK (state IN ('credited', 'refused')),
    generation  bigint NOT NULL,
    recorded_at timestamptz NOT NULL
);
CREATE INDEX transfers_in_by_sale ON transfers_in (sale_id, sku);

-- +goose Down
DROP TABLE transfers_in;
DROP TABLE late_payments;
DROP TABLE user_counts;
DROP TABLE holds;
DROP TABLE pools;
DROP TABLE sales;
DROP TABLE sale_fences;
DROP TABLE leader_epoch;
