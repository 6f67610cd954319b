-- +goose Up
-- The kill switch in the ledger: whether a sale (sku '') or one SKU of it admits new holds
-- at the regions, and why. version numbers the changes of one row from pause_versions, so a
-- region records a change only over an older one. A resume keeps the row, paused = false.
CREATE SEQUENCE pause_versions;

CREATE TABLE pauses (
    sale_id    text    NOT NULL REFERENCES sales (sale_id),
    sku        text    NOT NULL,
    paused     boolean NOT NULL,
    reason     text    NOT NULL,
    version    bigint  NOT NULL CHECK (version > 0),
    changed_at timestamptz NOT NULL,
    PRIMARY KEY (sale_id, sku)
);

-- A region that does not have a pause's latest change yet (its version): written with the
-- change, deleted once the region has recorded that version or a later one. The leader's
-- pause loop retries what is left every RetryInterval, like terms_undelivered.
CREATE TABLE pauses_undelivered (
    sale_id text   NOT NULL,
    sku     text   NOT NULL,
    region  text   NOT NULL,
    version bigint NOT NULL,
    PRIMARY KEY (sale_id, sku, region),
    FOREIGN KEY (sale_id, sku) REFERENCES pauses (sale_id, sku)
);

-- +goose Down
DROP TABLE pauses_undelivered;
DROP TABLE pauses;
DROP SEQUENCE pause_versions;
