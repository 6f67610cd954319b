-- +goose Up
-- The ledger says when a sale's unallocated units or unfinished transfers change, so the
-- leader's sold-out flags and rebalancer look again at that sale rather than at every sale
-- every round: a notification on the channel quota_ledger, its payload the sale's id, sent at
-- the commit of a transaction that added a SKU, changed its unallocated units, or added a
-- transfer or changed its state. Advisory: a leader that starts listening reads every sale
-- once.
-- +goose StatementBegin
CREATE FUNCTION notify_ledger_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('quota_ledger', NEW.sale_id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER skus_changed AFTER INSERT OR UPDATE OF unallocated ON skus
    FOR EACH ROW EXECUTE FUNCTION notify_ledger_change();
CREATE TRIGGER transfers_changed AFTER INSERT OR UPDATE OF state ON transfers
    FOR EACH ROW EXECUTE FUNCTION notify_ledger_change();

-- +goose Down
DROP TRIGGER transfers_changed ON transfers;
DROP TRIGGER skus_changed ON skus;
DROP FUNCTION notify_ledger_change();
