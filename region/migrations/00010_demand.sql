-- +goose Up
-- The units buyers asked for at this region and were refused for want of stock
-- (REGION_EXHAUSTED, SOLD_OUT), per pool and second. The leader counts them in memory and adds
-- them here every second; the coordinator's rebalancer reads them, with the holds created, as
-- each pool's demand (region.RecentDemand), so a pool that ran dry still shows the buyers it
-- turns away. Advisory: nothing is granted or refused on it. Rows older than an hour are
-- deleted.
CREATE TABLE demand (
    sale_id text        NOT NULL,
    sku     text        NOT NULL,
    at      timestamptz NOT NULL,
    units   bigint      NOT NULL CHECK (units > 0),
    PRIMARY KEY (sale_id, at, sku)
);

-- +goose Down
DROP TABLE demand;
