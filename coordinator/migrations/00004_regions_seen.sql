-- +goose Up
-- The regions a leading coordinator has been configured with. A coordinator that takes over
-- with a region not listed here queues every sale's terms for it (terms_undelivered) and
-- lists it, so a region added to the configuration after sales were created (or any region,
-- for sales created before migration 3) learns their terms once, and answers
-- REGION_EXHAUSTED rather than NOT_FOUND.
CREATE TABLE regions_seen (
    region text PRIMARY KEY
);

-- +goose Down
DROP TABLE regions_seen;
