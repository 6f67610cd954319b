-- +goose Up
-- The kill switch at a region: whether a sale (sku '') or one SKU of it admits new holds.
-- Written by the coordinator's SetPaused in its fenced op (I4), one row per sale and SKU; a
-- resume keeps the row with paused = false, so its version still orders a late retry of an
-- older change (which must not undo it). The leader keeps the paused rows in memory and
-- refuses new holds of them (PAUSED); Confirm, Release and expiry of existing holds go on.
CREATE TABLE pauses (
    sale_id    text    NOT NULL,
    sku        text    NOT NULL,
    paused     boolean NOT NULL,
    reason     text    NOT NULL,
    version    bigint  NOT NULL CHECK (version > 0),
    generation bigint  NOT NULL,
    changed_at timestamptz NOT NULL,
    PRIMARY KEY (sale_id, sku)
);

-- +goose Down
DROP TABLE pauses;
