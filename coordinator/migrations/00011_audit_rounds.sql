-- +goose Up
-- The continuous audit's memory (coordinator/audithistory.go): one row per round the
-- leader ran, with every violation it found and its evidence (violations, a JSON array),
-- and per round one row per audited sale with the result of each of its SKUs (skus, a JSON
-- array: the I1 terms, and each region's pool when the SKU was not ok). Rows are never
-- changed; the leader deletes those older than its retention (--audit-retention) in bounded
-- batches, a round's sales with it.
CREATE TABLE audit_rounds (
    round_id   bigserial PRIMARY KEY,
    at         timestamptz NOT NULL,
    took_ms    bigint  NOT NULL CHECK (took_ms >= 0),
    ok         boolean NOT NULL,
    skus       integer NOT NULL CHECK (skus >= 0),
    error      text    NOT NULL,
    violations jsonb   NOT NULL
);
CREATE INDEX audit_rounds_by_at ON audit_rounds (at);

CREATE TABLE audit_round_sales (
    round_id bigint  NOT NULL REFERENCES audit_rounds (round_id) ON DELETE CASCADE,
    sale_id  text    NOT NULL,
    ok       boolean NOT NULL,
    skus     jsonb   NOT NULL,
    PRIMARY KEY (round_id, sale_id)
);
CREATE INDEX audit_round_sales_by_sale ON audit_round_sales (sale_id, round_id);

-- +goose Down
DROP TABLE audit_round_sales;
DROP TABLE audit_rounds;
