-- +goose Up
-- Where this region's waiting-room page sends an admitted shopper, as the coordinator
-- published it (empty: the page admits no one).
ALTER TABLE sales ADD COLUMN room_return_url text NOT NULL DEFAULT '' CHECK (length(room_return_url) <= 1024);

-- +goose Down
ALTER TABLE sales DROP COLUMN room_return_url;
