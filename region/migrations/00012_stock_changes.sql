-- +goose Up
-- The region's database says when a sale's stock may have changed its sold-out or drained
-- state, so the coordinator reads a sale's pools when they change rather than every sale
-- every round: a notification on the channel quota_stock, its payload the sale's id, sent at
-- the commit of a transaction that created a pool, emptied or refilled one (available
-- crossing zero, or available + held crossing zero), or recorded refused demand. Advisory,
-- like the flags it feeds: nothing is granted or refused on it, and a listener that
-- (re)connects reads every sale once (region.WatchStock). Moves that cross no zero notify
-- nothing, so the hot path's batches pay only the trigger's WHEN test.
-- +goose StatementBegin
CREATE FUNCTION notify_stock_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('quota_stock', NEW.sale_id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER pools_created AFTER INSERT ON pools
    FOR EACH ROW EXECUTE FUNCTION notify_stock_change();
CREATE TRIGGER pools_crossed_zero AFTER UPDATE ON pools
    FOR EACH ROW WHEN ((OLD.available = 0) <> (NEW.available = 0)
        OR (OLD.available + OLD.held = 0) <> (NEW.available + NEW.held = 0))
    EXECUTE FUNCTION notify_stock_change();
CREATE TRIGGER demand_refused AFTER INSERT OR UPDATE ON demand
    FOR EACH ROW EXECUTE FUNCTION notify_stock_change();

-- +goose Down
DROP TRIGGER demand_refused ON demand;
DROP TRIGGER pools_crossed_zero ON pools;
DROP TRIGGER pools_created ON pools;
DROP FUNCTION notify_stock_change();
