-- +goose Up
-- The coordinator's ledger. Every ledger transaction first passes the generation fence
-- (I4); counts are non-negative by CHECK (I2).

CREATE TABLE ledger_fence (
    id         int PRIMARY KEY CHECK (id = 1),
    generation bigint NOT NULL CHECK (generation >= 0)
);
INSERT INTO ledger_fence (id, generation) VALUES (1, 0);

CREATE TABLE sales (
    sale_id        text PRIMARY KEY,
    per_user_limit bigint NOT NULL CHECK (per_user_limit > 0),
    hold_ttl_ms    bigint NOT NULL CHECK (hold_ttl_ms > 0),
    opens_at       timestamptz NOT NULL,
    created_at     timestamptz NOT NULL,
    definition     text NOT NULL
);

CREATE TABLE skus (
    sale_id     text   NOT NULL REFERENCES sales (sale_id),
    sku         text   NOT NULL,
    total       bigint NOT NULL CHECK (total >= 0),
    unallocated bigint NOT NULL CHECK (unallocated >= 0 AND unallocated <= total),
    PRIMARY KEY (sale_id, sku)
);

CREATE TABLE allocations (
    request_id  text PRIMARY KEY,
    sale_id     text NOT NULL REFERENCES sales (sale_id),
    fingerprint text NOT NULL,
    created_at  timestamptz NOT NULL
);

CREATE TABLE transfers (
    transfer_id text PRIMARY KEY,
    request_id  text NOT NULL,
    sale_id     text NOT NULL,
    sku         text NOT NULL,
    from_pool   text NOT NULL,
    to_pool     text NOT NULL,
    units       bigint NOT NULL CHECK (units > 0),
    state       text NOT NULL CHECK (state IN ('requested', 'pending', 'posted', 'voided')),
    generation  bigint NOT NULL,
    stranded    boolean NOT NULL DEFAULT false,
    reason      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    CHECK (from_pool <> to_pool),
    FOREIGN KEY (sale_id, sku) REFERENCES skus (sale_id, sku)
);
CREATE INDEX transfers_open ON transfers (state, created_at);
CREATE INDEX transfers_by_sale ON transfers (sale_id, sku);

-- +goose Down
DROP TABLE transfers;
DROP TABLE allocations;
DROP TABLE skus;
DROP TABLE sales;
DROP TABLE ledger_fence;
