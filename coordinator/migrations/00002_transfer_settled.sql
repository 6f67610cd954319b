-- +goose Up
-- settled: the source region has recorded that the destination credited the transfer
-- (bookkeeping after posted; the driver retries it until done).
ALTER TABLE transfers ADD COLUMN settled boolean NOT NULL DEFAULT false;
UPDATE transfers SET settled = true WHERE from_pool = 'unallocated' OR state <> 'posted';

-- +goose Down
ALTER TABLE transfers DROP COLUMN settled;
