-- +goose Up
-- Where the regions' waiting-room page sends an admitted shopper, with the ticket (empty: the
-- page admits no one); published to the regions with the other terms.
ALTER TABLE sales ADD COLUMN room_return_url text NOT NULL DEFAULT '' CHECK (length(room_return_url) <= 1024);

-- +goose Down
ALTER TABLE sales DROP COLUMN room_return_url;
