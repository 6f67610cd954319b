-- +goose Up
-- The waiting rooms' and waitlists' entries at this region (region/line.go): written before
-- the buyer is answered, so a leader taking over rebuilds every line as it was. A room's
-- entry has sku ''; a waitlist's, its SKU. seq is the order the entries were recorded in
-- (one counter for the region, rising); pre marks an arrival in a room's pre-queue, drawn at
-- opening from the published seed. state is queued, admitted (a ticket or an offer is out
-- until expires_at; units are an offer's) or elsewhere (bound to bound_region). Used is not
-- written: a hold made with the admission (holds.admission_id) says it. Binding is not
-- written either: a buyer being bound is queued again at a new leader's front. Ended entries
-- are pruned once their retention has passed (Door's pruning), so the table holds the live
-- lines and not their history.
CREATE TABLE line_entries (
    sale_id      text        NOT NULL,
    admission_id text        NOT NULL,
    user_id      text        NOT NULL,
    sku          text        NOT NULL DEFAULT '',
    seq          bigint      NOT NULL,
    pre          boolean     NOT NULL DEFAULT false,
    state        text        NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'admitted', 'elsewhere')),
    expires_at   timestamptz,
    units        bigint      NOT NULL DEFAULT 0 CHECK (units >= 0),
    bound_region text        NOT NULL DEFAULT '',
    entered_at   timestamptz NOT NULL,
    PRIMARY KEY (sale_id, admission_id),
    CONSTRAINT line_entries_admitted_expire CHECK ((state = 'admitted') = (expires_at IS NOT NULL))
);
CREATE UNIQUE INDEX line_entries_seq ON line_entries (seq);

-- +goose Down
DROP TABLE line_entries;
