// Package region is one region's reservation service: its pools, holds, per-user counts,
// idempotency records and inbound transfers, kept in the region's own SQL database and
// changed only by a single writer that commits operations in batches (group commit).
//
// Where things are, in reading order. Each request file starts at its exported entry point,
// then the checks made before the writer, then its ops (the op type and its apply, run by
// the writer) and what only they call:
//
//   - types.go: the API's types and errors (Hold, ReserveRequest, CreditRequest, …).
//   - reserve.go: Reserve: CheckReserve, checkAgainstTerms, the empty-pool answer
//     (reserveWhenEmpty), the writer path (reserveLookingUp: the SQL lookup a key or buyer
//     not in memory needs, made before the writer and again whenever its reserveAnswer asks;
//     reserveInWriter), the replay of a stored key (replayStored, storedKey, replayOf), then
//     reserveOp.apply and batch.take.
//   - hold.go: Confirm, Release, GetReservation and BuyerHolds (checkHoldID, submitForHold,
//     readHold), confirmOp, releaseOp and the sweeper's expireOp, and batch.closeHold.
//   - participant.go: the coordinator's requests: PutSale, Credit, Refuse, Debit, RefuseDebit,
//     Restore, Settle and Status, with their validators (CheckTerms, CheckCredit, CheckDebit,
//     CheckTransferRef), checkGeneration, and their ops (putSaleOp, creditOp, refuseOp,
//     debitOp, restoreOp, settleOp, transitionOut), each after its entry point.
//   - stock.go: Stock.
//   - binding.go: a buyer's binding to a region at their first reservation in a sale without a
//     waiting room (the global per-user limit), before the writer.
//   - door.go: the front door of a sale with a waiting room: admissions, tickets, the
//     binding of each admitted buyer, the sale's view; gates.go: what it checks before a
//     buyer enters or is admitted (bot limits, the kill switch, the sold-out flags);
//     waitlist.go: the waitlist's offers of units that come back; aside.go: the units set
//     aside for those offers; line.go: the lines made durable (lineWriter, line_entries)
//     and lineload.go: their load at the start of a term.
//   - shown.go: the names of hold and admission states every adapter shows.
//
// Shared by those paths:
//
//   - validate.go: checkIDs and checkQuantity, the field checks the entry points share.
//   - terms.go: a sale's terms as read from SQL (readTerms; cached by readCache.terms).
//   - stored.go: reading stored holds (rowQuerier, holdColumns, scanHold).
//
// The machinery under every request:
//
//   - region.go: Config, and Region: the parts below, sharing its configuration and its
//     database, and what the writer's commits tell them (applyCommitted).
//   - leader.go: leadership, the terms of leadership: Lead (the epoch fence, then the load),
//     StepDown, the current writer (submitOp), reload and batch-failure recovery.
//   - cache.go: readCache, what requests read without the writer: the committed state, the
//     keys in the writer, the pools' available counts, the sales' terms, the SOLD_OUT
//     answers and the pauses.
//   - writer.go: the op interface (op[T], typed by its result), the batch an op decides in,
//     and the writer goroutine (submit, submitThen, run, collect, commit).
//   - flush.go: a batch's writes to SQL (writes.flush, execAll, flushOnce).
//   - mem.go: the leader's in-memory state (memState).
//   - archive.go: retiring closed holds from memory (errHoldNotInMemory, mayBeArchived,
//     lookupFor, retireClosed); archiver.go: moving them to holds_closed (archiveOp) and
//     reading a buyer's archived counts when first needed (readBuyers, resolve);
//     keyfilter.go: the fixed-size filter of retired keys.
//   - load.go: loading memState from SQL on taking leadership; standby.go: warmCopy, the
//     warm standby's copy of the state, handed to leadership at takeover.
//   - sweeper.go: the sweeper (expiry, then archiving); memlimit.go: the warning when a
//     loaded state nears the memory limit; pause.go: the kill switch; verify.go: QUOTA_VERIFY
//     checks; books.go: read-only queries (ReadBooks, RecentDemand, ReadUnsold); demand.go:
//     the demand counts; metrics.go: what a region counts for its operators (Metrics);
//     migrate.go: the schema's migrations (Migrate).
//   - transfer_effects.go: each transfer step's decision and effects, produced once: the
//     participant ops turn them into SQL, Core applies them.
//   - core.go, core_transfer.go: Core, the simulation's in-memory region.
package region
