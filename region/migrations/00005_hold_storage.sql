-- +goose Up
-- Every hold insert is on the critical path of a batch, so the holds table stores its keys
-- as cheaply as PostgreSQL compares them:
--
-- - Text keys compare byte by byte (COLLATE "C"). Under a database's libc collation (C.UTF-8
--   on Debian, which PostgreSQL 15 does not treat as C) each index comparison went through
--   strcoll, and a hold insert makes dozens of them in three indexes. Nothing sorts holds
--   for people to read, so byte order costs nothing.
-- - The request fingerprint is its 16 bytes, not 32 hex characters.
--
-- Both rewrite the table and its indexes once.
ALTER TABLE holds
    ALTER COLUMN hold_id TYPE text COLLATE "C",
    ALTER COLUMN sale_id TYPE text COLLATE "C",
    ALTER COLUMN sku TYPE text COLLATE "C",
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN request_key TYPE text COLLATE "C",
    ALTER COLUMN state TYPE text COLLATE "C",
    ALTER COLUMN request_hash TYPE bytea USING decode(request_hash, 'hex');
ALTER TABLE holds ADD CONSTRAINT holds_request_hash_len CHECK (length(request_hash) = 16);

-- +goose Down
ALTER TABLE holds DROP CONSTRAINT holds_request_hash_len;
ALTER TABLE holds
    ALTER COLUMN hold_id TYPE text COLLATE "default",
    ALTER COLUMN sale_id TYPE text COLLATE "default",
    ALTER COLUMN sku TYPE text COLLATE "default",
    ALTER COLUMN user_id TYPE text COLLATE "default",
    ALTER COLUMN request_key TYPE text COLLATE "default",
    ALTER COLUMN state TYPE text COLLATE "default",
    ALTER COLUMN request_hash TYPE text USING encode(request_hash, 'hex');
