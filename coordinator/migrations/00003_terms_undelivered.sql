-- +goose Up
-- A region that has not yet been told a sale's terms: written with the sale, deleted once the
-- region has them. The leader's terms loop retries what is left, so a region that was down
-- when the sale was created learns it without waiting for a credit, and answers
-- REGION_EXHAUSTED, not NOT_FOUND.
CREATE TABLE terms_undelivered (
    sale_id text NOT NULL REFERENCES sales (sale_id),
    region  text NOT NULL,
    PRIMARY KEY (sale_id, region)
);

-- +goose Down
DROP TABLE terms_undelivered;
