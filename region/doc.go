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
//     (reserveWhenEmpty), the writer path (reserveInWriter, track, inWriter), the replay of a
//     stored key (replayStored, storedKey, replayOf), then reserveOp.apply and batch.take.
//   - hold.go: Confirm, Release and GetReservation (checkHoldID, submitForHold, readHold),
//     confirmOp, releaseOp and the sweeper's expireOp, and batch.closeHold.
//   - participant.go: the coordinator's requests: PutSale, Credit, Refuse, Debit, RefuseDebit,
//     Restore, Settle and Status, with their validators (CheckTerms, CheckCredit, CheckDebit,
//     CheckTransferRef), checkGeneration, and their ops (putSaleOp, creditOp, refuseOp,
//     debitOp, restoreOp, settleOp, transitionOut), each after its entry point.
//   - stock.go: Stock.
//   - binding.go: a buyer's binding to a region at their first reservation in a sale without a
//     waiting room (the global per-user limit), before the writer.
//   - door.go: the front door of a sale with a waiting room: admissions, tickets, the
//     binding of each admitted buyer, the sale's view; waitlist.go: the waitlist's offers of
//     units that come back; aside.go: the units set aside for those offers.
//
// Shared by those paths:
//
//   - validate.go: checkIDs and checkQuantity, the field checks the entry points share.
//   - terms.go: a sale's terms, cached (Region.terms) and read from SQL (readTerms).
//   - stored.go: reading stored holds (rowQuerier, holdColumns, scanHold).
//
// The machinery under every request:
//
//   - region.go: Config, Region, leadership (Lead, StepDown), writer() and submit/submitAs,
//     reload and batch-failure recovery.
//   - writer.go: the op interface, the batch an op decides in, and the writer goroutine
//     (submitThen, run, collect, commit).
//   - flush.go: a batch's writes to SQL (writes.flush, execAll, flushOnce).
//   - mem.go: the leader's in-memory state (memState).
//   - archive.go: retiring closed holds from memory (errKeyRetired, errHoldNotInMemory,
//     mayBeArchived, retireClosed); archiver.go: moving them to holds_closed (archiveOp) and
//     reading a buyer's archived counts when first needed (readBuyers, resolve);
//     keyfilter.go: the fixed-size filter of retired keys.
//   - load.go: loading memState from SQL on taking leadership; standby.go: the warm standby.
//   - sweeper.go: the expiry sweeper; pause.go: the kill switch; verify.go: QUOTA_VERIFY
//     checks; books.go: read-only queries (ReadBooks, RecentDemand, ReadUnsold); demand.go:
//     the demand counts; metrics.go: what a region counts for its operators (Metrics);
//     migrate.go: the schema's migrations (Migrate).
//   - transfer_effects.go: each transfer step's decision and effects, produced once: the
//     participant ops turn them into SQL, Core applies them.
//   - core.go, core_transfer.go: Core, the simulation's in-memory region.
package region
