-- +goose Up
-- A user's held and bought units are sums over the user's holds: the leader computes them
-- while it loads the holds, so keeping them in a table of their own only cost every batch an
-- upsert per user.
DROP TABLE user_counts;

-- quota_expect fails the statement (and so the implicit transaction of a one-round-trip
-- batch) when a guarded write changed another number of rows than the leader decided.
-- +goose StatementBegin
CREATE FUNCTION quota_expect(got bigint, want bigint, what text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF got <> want THEN
        RAISE EXCEPTION 'guard failed: % changed % rows, want %', what, got, want;
    END IF;
    RETURN got;
END
$$;
-- +goose StatementEnd

-- quota_check_epoch is the writer's epoch fence as one statement (fencing.QueueEpochCheck):
-- a share lock on the epoch row, so a new leader's RaiseEpoch waits for the batch, and a
-- failure (SQLSTATE QE001) unless the epoch is still the writer's.
-- +goose StatementBegin
CREATE FUNCTION quota_check_epoch(want bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM leader_epoch WHERE id = 1 AND epoch = want FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'writer epoch % is no longer current', want USING ERRCODE = 'QE001';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION quota_check_epoch(bigint);
DROP FUNCTION quota_expect(bigint, bigint, text);
CREATE TABLE user_counts (
    sale_id    text   NOT NULL,
    sku        text   NOT NULL,
    user_id    text   NOT NULL,
    held_qty   bigint NOT NULL CHECK (held_qty >= 0),
    bought_qty bigint NOT NULL CHECK (bought_qty >= 0),
    PRIMARY KEY (sale_id, sku, user_id)
);
INSERT INTO user_counts
SELECT sale_id, sku, user_id,
       coalesce(sum(quantity) FILTER (WHERE state = 'held'), 0),
       coalesce(sum(quantity) FILTER (WHERE state = 'sold'), 0)
FROM holds GROUP BY sale_id, sku, user_id;
