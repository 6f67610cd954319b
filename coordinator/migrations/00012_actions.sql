-- +goose Up
-- The operators' action log (coordinator/actions.go): every state-changing call made to a
-- coordinator, by gRPC or on the console, with who made it (the client certificate's role
-- and name, or the console login's), what, when and its result. Hash-chained
-- (transfer.ActionHash): hash = sha256(prev_hash || the row's canonical bytes), seq without
-- gaps, so a row changed or removed afterwards is found (quotactl audit --actions). Rows are
-- only added, one at a time under an advisory lock.
CREATE TABLE actions (
    seq       bigint PRIMARY KEY CHECK (seq > 0),
    at        timestamptz NOT NULL,
    role      text  NOT NULL,
    actor     text  NOT NULL,
    via       text  NOT NULL,
    action    text  NOT NULL,
    target    text  NOT NULL,
    detail    text  NOT NULL,
    result    text  NOT NULL,
    prev_hash bytea NOT NULL,
    hash      bytea NOT NULL
);

-- +goose Down
DROP TABLE actions;
