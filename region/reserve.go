package region

import (
	"container/heap"
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// Reserve takes req.Quantity units from this region's pool for req.User and returns the
// hold, durable before it returns (I6). Bad input changes nothing and names the field. Every
// answer is counted (Config.Metrics).
func (r *Region) Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error) {
	res, err := r.reserve(ctx, req)
	r.cfg.Metrics.Reserved(err)
	r.demand.count(req, err)
	return res, err
}

// reserve is Reserve, uncounted.
func (r *Region) reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error) {
	if err := CheckReserve(req); err != nil {
		return ReserveResult{}, err
	}
	t, err := r.terms(ctx, req.Sale)
	if err != nil {
		return ReserveResult{}, err
	}
	now := r.cfg.Clock.Now()
	if err := checkAgainstTerms(t, req, now); err != nil {
		return ReserveResult{}, err
	}
	w, err := r.writer() // a standby answers NOT_LEADER, even for an empty pool
	if err != nil {
		return ReserveResult{}, err
	}
	k := keyKey{req.Sale, req.User, req.RequestKey}
	admitted, vouched, err := checkTicket(&r.cfg, t, req, now)
	if err != nil {
		// A retry of a granted request gets its hold back even once its ticket has expired
		// (I6: the key decides), as long as the leader's memory has the key; but only for a
		// ticket signed by the cluster for this buyer: a forged one that names the buyer gets
		// TICKET_INVALID, never the buyer's hold.
		if m := r.state.Load(); vouched && m != nil && !r.inWriter(k) {
			if prior, ok := m.committedKey(k); ok {
				return replayOf(prior, req)
			}
		}
		return ReserveResult{}, err
	}
	if err := r.binds.elsewhere(req.Sale, req.User); err != nil {
		return ReserveResult{}, err
	}
	if avail, ok := r.cachedAvailable(poolKey{req.Sale, req.SKU}); ok && !r.inWriter(k) {
		if req.fromAside == 0 {
			avail -= min(r.aside.of(poolKey{req.Sale, req.SKU}), avail) // an open buyer may not take the waitlist's units
		}
		if avail < req.Quantity {
			return r.reserveWhenEmpty(ctx, req, k, avail)
		}
	}
	// The buyer is bound to this region before the writer decides (binding.go): a hold is
	// never acknowledged to a buyer not bound here.
	unbound, err := r.binds.buyer(ctx, t, req, r.paused.Load())
	if err != nil {
		return ReserveResult{}, err
	}
	o := &reserveOp{req: req, terms: t, holdID: newHoldID(&r.cfg), region: r.cfg.Name, exhausted: r.exhausted, maxKeys: r.cfg.MaxKeysPerUser,
		ticket: admitted, unbound: unbound}
	return r.reserveLookingUp(ctx, w, k, o)
}

// lookup is what a reserve needs read from SQL before the writer can decide it: nothing,
// the hold of its key (the key may be a retired or archived hold's), or that and its buyer's
// archived rows (a buyer of a lazy sale whose archived holds are not in memory, archive.go).
type lookup uint8

const (
	lookupNone lookup = iota
	lookupKey
	lookupBuyer
)

// reserveAnswer is the writer's answer to a reserve: its result, or, with need set, the
// lookup to make before the reserve is submitted again (reserveLookingUp).
type reserveAnswer struct {
	ReserveResult
	need lookup
}

// maxLookups bounds the SQL lookups one reserve makes for a key or a buyer the writer does
// not have in memory (lookUpArchived).
const maxLookups = 3

// reserveLookingUp submits o to w, first making the lookup the committed state says the
// reserve needs (memState.lookupFor), then any the writer still asks for: the state it
// decides in may have changed since it was read (a reload, a batch that retired the key).
// A hold SQL has of the key is the answer (a replay), without the writer.
func (r *Region) reserveLookingUp(ctx context.Context, w *writer, k keyKey, o *reserveOp) (ReserveResult, error) {
	need := lookupNone
	if m := r.state.Load(); m != nil {
		if _, ok := m.committedKey(k); !ok {
			need = m.lookupFor(k)
		}
	}
	for lookups := 0; ; lookups++ {
		if need != lookupNone {
			if lookups == maxLookups {
				// The leader reloaded its state between each read and its submit: say so,
				// and let the client retry with the same key.
				return ReserveResult{}, fmt.Errorf("%w: the region's state was reloaded while the request was looked up", ErrUnknownOutcome)
			}
			if err := r.lookUpArchived(ctx, o.req, k, o, need == lookupBuyer); err != nil {
				return ReserveResult{}, err
			}
			if o.replay != nil {
				return replayOf(o.replay, o.req)
			}
		}
		ans, err := r.reserveInWriter(ctx, w, k, o)
		if err != nil || ans.need == lookupNone {
			return ans.ReserveResult, err
		}
		need = ans.need
	}
}

// lookUpArchived reads from SQL what the writer asked for before it decides a reserve: the
// hold of the request's key, in holds or the archive (found: o.replay, the answer), and, when
// buyer is set, the buyer's archived rows (o.buyer), read for the state the writer leads from
// now (o.from: rows read for another state may be stale and are not used, archive.go).
// Between two submits the key is not counted as in the writer, so a same-key request
// meanwhile may be answered by the empty-pool path as if it came first; no request is
// decided twice.
func (r *Region) lookUpArchived(ctx context.Context, req ReserveRequest, k keyKey, o *reserveOp, buyer bool) error {
	from := r.state.Load()
	prior, found, err := storedKey(ctx, r.pool, r.cfg.Name, k)
	if err != nil || found {
		o.replay = prior
		return err
	}
	o.keyLookedUp = true // SQL has no hold of this key: a digest that matches it is another key's
	if !buyer {
		return nil
	}
	got, err := readBuyers(ctx, r.pool, []saleUser{{req.Sale, req.User}})
	if err != nil {
		return err
	}
	o.buyer, o.from = got[saleUser{req.Sale, req.User}], from
	return nil
}

// readToken is req.Token when it is Ticket's, else nil.
func (req *ReserveRequest) readToken() *admission.Token {
	if req.Token == nil || req.Token.Text() != req.Ticket {
		return nil
	}
	return req.Token
}

// token is Ticket read (admission.ParseToken), kept in Token for the region's checks: nil
// when there is no ticket or it is malformed (the region's check says so).
func (req *ReserveRequest) token() *admission.Token {
	if tok := req.readToken(); tok != nil || req.Ticket == "" {
		return tok
	}
	tok, err := admission.ParseToken(req.Ticket)
	if err != nil {
		return nil
	}
	req.Token = tok
	return tok
}

// CheckReserve validates a reserve request's fields on their own (no state needed), naming
// the first bad field.
func CheckReserve(req ReserveRequest) error {
	if err := checkIDs("sale_id", req.Sale, "sku", req.SKU, "user_id", req.User, "request_key", req.RequestKey); err != nil {
		return err
	}
	return checkQuantity("quantity", req.Quantity)
}

// checkAgainstTerms refuses a reserve the sale's terms rule out before any state is read:
// an SKU not in the sale, a quantity over the per-user limit, a sale not open yet.
func checkAgainstTerms(t SaleTerms, req ReserveRequest, now time.Time) error {
	if !t.HasSKU(req.SKU) {
		return fmt.Errorf("sku %q is not in sale %s: %w", req.SKU, req.Sale, ErrNotFound)
	}
	if req.Quantity > t.PerUserLimit {
		return apierr.Invalid("quantity", "%d is over the per-user limit %d", req.Quantity, t.PerUserLimit)
	}
	if now.Before(t.OpensAt) {
		return fmt.Errorf("sale_id %q opens at %s (in %s): %w", req.Sale,
			t.OpensAt.UTC().Format(time.RFC3339), t.OpensAt.Sub(now).Round(time.Second), ErrNotOpen)
	}
	return nil
}

// reserveWhenEmpty answers a reserve the pool cannot satisfy without the writer and, but for
// a key that may be a retired or archived hold's, without SQL. The key is not in the writer
// (checked first), so the committed index has every hold it ever got (the writer publishes a
// hold before it answers), or its digest once the hold retired or was archived, unless its
// buyer's archived holds are not in memory yet: a retry of a granted request gets its hold
// back, a new one is told the region is exhausted.
func (r *Region) reserveWhenEmpty(ctx context.Context, req ReserveRequest, k keyKey, avail transfer.Units) (ReserveResult, error) {
	m := r.state.Load()
	if m == nil {
		// The state was dropped (forget) after the count was read: nothing can be said
		// without it, and the writer is stopping.
		return ReserveResult{}, r.notLeader()
	}
	if prior, ok := m.committedKey(k); ok {
		return replayOf(prior, req)
	}
	if m.mayBeArchived(k) { // a hold that closed long ago, or a false positive: SQL tells
		if prior, found, err := r.replayStored(ctx, req, k); found || err != nil {
			return prior, err
		}
	}
	if err := r.paused.Load().refuse(req); err != nil {
		return ReserveResult{}, err
	}
	return ReserveResult{}, r.exhausted(req, avail)
}

// reserveInWriter submits a reserve to the writer. The key counts as in the writer until its
// op is done, even if this caller gives up first: a retry meanwhile must go through the
// writer, not the empty-pool answer.
func (r *Region) reserveInWriter(ctx context.Context, w *writer, k keyKey, o *reserveOp) (reserveAnswer, error) {
	r.track(k, 1)
	res, err := submitThen[reserveAnswer](ctx, w, o, func() { r.track(k, -1) })
	if err != nil {
		return reserveAnswer{}, err
	}
	return res, nil
}

// replayStored answers a reserve whose key may be a retired hold's from that hold as stored:
// the same request gets the hold back (a replay), another one ALREADY_EXISTS. found is false
// when SQL has no hold of the key.
func (r *Region) replayStored(ctx context.Context, req ReserveRequest, k keyKey) (res ReserveResult, found bool, err error) {
	prior, found, err := storedKey(ctx, r.pool, r.cfg.Name, k)
	if !found || err != nil {
		return ReserveResult{}, found, err
	}
	res, err = replayOf(prior, req)
	return res, true, err
}

// storedKey reads the hold of an idempotency key from SQL, in holds or the archive, with its
// request fingerprint.
func storedKey(ctx context.Context, q rowQuerier, region string, k keyKey) (*memHold, bool, error) {
	var hash string
	h, err := scanHold(q.QueryRow(ctx, `SELECT `+holdColumns+`, request_hash FROM holds
			WHERE sale_id = $1 AND user_id = $2 AND request_key = $3
		UNION ALL SELECT `+holdColumns+`, request_hash FROM holds_closed
			WHERE sale_id = $1 AND user_id = $2 AND request_key = $3
		LIMIT 1`, k.sale, k.user, k.key), region, &hash)
	if err == pgx.ErrNoRows {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read the hold of request_key %q: %w", k.key, err)
	}
	fp, err := fingerprint(h.ID, []byte(hash))
	if err != nil {
		return nil, false, err
	}
	return &memHold{Hold: h, hash: fp}, true, nil
}

// replayOf answers a reserve whose key already has a hold: the hold itself when the request
// is the same (I6: a retry never takes units twice), ALREADY_EXISTS when it is another.
func replayOf(prior *memHold, req ReserveRequest) (ReserveResult, error) {
	if prior.hash != requestHash(req.SKU, req.Quantity) {
		return ReserveResult{}, fmt.Errorf("request_key %q was used for a different request (sku %s, quantity %d): %w",
			req.RequestKey, prior.SKU, prior.Quantity, ErrAlreadyExists)
	}
	return ReserveResult{Hold: prior.Hold, Replayed: true}, nil
}

// requestHash fingerprints what a request key stands for, so a retry is told apart from a
// reuse of the key for a different request: the first 16 bytes of a SHA-256, stored as hex.
func requestHash(sku string, q transfer.Units) [16]byte {
	var buf [64]byte
	h := sha256.Sum256(strconv.AppendInt(append(append(buf[:0], sku...), 0), int64(q), 10))
	return [16]byte(h[:16])
}

type reserveOp struct {
	req       ReserveRequest
	terms     SaleTerms
	holdID    string
	region    string
	exhausted func(ReserveRequest, transfer.Units) error
	maxKeys   int32 // Config.MaxKeysPerUser
	// keyLookedUp says SQL has no hold of the request's key: a retired digest that matches it
	// is another key's (a false positive), not this one's. replay is the hold SQL has of it.
	keyLookedUp bool
	replay      *memHold
	// buyer is the buyer's archived rows, read for the state from (lookUpArchived), for a
	// buyer whose archived holds the writer does not have in memory.
	buyer *archivedBuyer
	from  *memState
	// ticket is the request's verified admission ticket, in a sale with a waiting room.
	ticket admission.Ticket
	// unbound says the binding step left the buyer unbound, the sale being paused
	// (bindings.buyer): the op may replay a granted hold or be refused, never take.
	unbound bool
}

// apply is the atomic conditional take, decided in memory by the single writer: the pool's
// available ≥ q and the user's held + bought + q ≤ limit are checked and changed in the same
// step, and the hold and counters are written in this batch's commit, before any reply (I6).
// Preserves I1 (available → held), I2 (checked here, CHECKs in SQL) and I3 (credited_in and
// debited_out unchanged).
func (o *reserveOp) apply(_ context.Context, b *batch) (reserveAnswer, error, error) {
	req := o.req
	hash := requestHash(req.SKU, req.Quantity)
	k := keyKey{req.Sale, req.User, req.RequestKey}
	if prior, ok := b.key(k); ok {
		res, err := replayOf(prior, req)
		return reserveAnswer{ReserveResult: res}, err, nil
	}
	if need := o.lookupNeeded(b, k); need != lookupNone {
		return reserveAnswer{need: need}, nil, nil
	}
	if a := o.ticket.Admission; a != "" && b.m.ticketUsedBy(req.Sale, a, req.RequestKey) {
		return reserveAnswer{}, fmt.Errorf("admission %s's ticket already backs another request_key: %w", a, ErrTicketUsed), nil
	}
	if err := b.m.paused.refuse(req); err != nil {
		return reserveAnswer{}, err, nil // the kill switch: no new hold (a retry of a granted one is answered above)
	}
	if o.unbound {
		return reserveAnswer{}, fmt.Errorf("sale %s was resumed while the reservation was on its way, its buyer not yet bound to this region: %w",
			req.Sale, ErrAborted), nil
	}
	pk := poolKey{req.Sale, req.SKU}
	p := b.m.pools[pk]
	if p == nil {
		return reserveAnswer{}, o.exhausted(req, 0), nil
	}
	// The units set aside for the SKU's waitlist are the waitlist's offers' to take: an open
	// buyer sees available − aside. A gate only: they are in available (I1 unchanged).
	aside := b.asideNow(pk, p.available)
	free := p.available - aside
	if req.fromAside > 0 {
		if req.Quantity > req.fromAside {
			return reserveAnswer{}, apierr.Invalid("quantity", "%d is over the %d units the waitlist offered", req.Quantity, req.fromAside), nil
		}
		free = p.available
	}
	if free < req.Quantity {
		b.touched[pk] = p.available
		return reserveAnswer{}, o.exhausted(req, free), nil
	}
	var used transfer.Units
	if u := b.m.users[userKey{req.Sale, req.SKU, req.User}]; u != nil {
		used = u.held + u.bought
	}
	if used+req.Quantity > o.terms.PerUserLimit {
		return reserveAnswer{}, fmt.Errorf("user %s has %d of %s, limit %d: %w", req.User, used, req.SKU, o.terms.PerUserLimit, ErrLimitExceeded), nil
	}
	if n := b.m.keysPer[saleUser{req.Sale, req.User}]; n >= o.maxKeys {
		return reserveAnswer{}, fmt.Errorf("user %s has used %d request keys in sale %s here, the most a buyer may: %w", req.User, n, req.Sale, apierr.ErrTooManyKeys), nil
	}
	h := &memHold{Hold: Hold{ID: o.holdID, Region: o.region, Sale: req.Sale, SKU: req.SKU, User: req.User, Quantity: req.Quantity,
		RequestKey: req.RequestKey, State: Held, CreatedAt: b.now, ExpiresAt: b.now.Add(o.terms.HoldTTL), Admission: o.ticket.Admission},
		hash: hash}
	b.take(h)
	if req.fromAside > 0 {
		b.asideDelta[pk] -= min(req.Quantity, aside) // the offer's units leave the waitlist's book
	}
	return reserveAnswer{ReserveResult: ReserveResult{Hold: h.Hold}}, nil, nil
}

// lookupNeeded is what the caller must read from SQL before the writer can decide the
// reserve of key k (lookupNone: nothing). A buyer whose archived rows were read for this
// state is resolved here.
func (o *reserveOp) lookupNeeded(b *batch, k keyKey) lookup {
	if !b.m.knowsBuyer(k.sale, k.user) {
		if o.buyer == nil || o.from != b.m {
			return lookupBuyer // the caller reads the buyer's archived rows and asks again
		}
		b.m.mu.Lock()
		b.m.resolve(o.buyer) // I2: the buyer's archived bought units and keys count from here on
		b.m.mu.Unlock()
	}
	if !o.keyLookedUp && b.m.retiredKey(k) {
		return lookupKey // the caller looks the key up in SQL and asks again
	}
	return lookupNone
}

// take records a new hold: available → held in its pool, the user's held count up. The
// caller has checked both conditions (I1, I2, I3).
func (b *batch) take(h *memHold) {
	pk, uk, q := poolKey{h.Sale, h.SKU}, userKey{h.Sale, h.SKU, h.User}, h.Quantity
	p := b.m.pools[pk]
	if p == nil || p.available < q {
		panic(fmt.Sprintf("region: take %d from pool %+v", q, p)) // the caller checked: a programmer error
	}
	p.available -= q
	p.held += q
	u := b.m.users[uk]
	if u == nil {
		u = &memUser{}
		b.m.users[uk] = u
	}
	u.held += q
	d := b.w.pool(pk)
	d.available -= q
	d.held += q
	b.w.newHolds = append(b.w.newHolds, h)
	b.m.keysPer[saleUser{h.Sale, h.User}]++
	b.m.useTicket(h.Hold)
	b.put(h)
	heap.Push(&b.m.due, dueHold{h.ExpiresAt, h.ID})
	b.touched[pk] = p.available
}

// checkTicket verifies a reservation's admission ticket in a sale with a waiting room: signed
// by a key of the cluster, for this sale, buyer and region, not expired by this region's clock
// (and, from a waitlist, for this SKU). Whether it already backs another request key is the
// writer's to decide (reserveOp.apply), with the hold. A sale without a waiting room takes no
// ticket. vouched is whether the request's buyer is who it says, for a replay of its key: the
// ticket's signature and buyer checked out (a failure is then its expiry or its SKU), or the
// sale has no waiting room (its requests name the buyer).
func checkTicket(cfg *Config, t SaleTerms, req ReserveRequest, now time.Time) (tk admission.Ticket, vouched bool, err error) {
	if !t.Admission.Waiting() {
		if req.Ticket != "" {
			return admission.Ticket{}, true, apierr.Invalid("ticket", "sale %s has no waiting room; send no ticket", req.Sale)
		}
		return admission.Ticket{}, true, nil
	}
	if req.Ticket == "" {
		return admission.Ticket{}, false, fmt.Errorf("sale %s admits through its waiting room: a reservation needs a ticket: %w", req.Sale, ErrTicketInvalid)
	}
	var keys *admission.Keyring
	if cfg.Cluster.Tickets != nil {
		keys = cfg.Cluster.Tickets()
	}
	if keys == nil {
		return admission.Ticket{}, false, fmt.Errorf("region %s has no ticket keys to check tickets with: %w", cfg.Name, ErrTicketInvalid)
	}
	tok := req.token()
	if tok == nil {
		_, err := admission.ParseToken(req.Ticket) // malformed: say how
		return admission.Ticket{}, false, err
	}
	// The signature first: until it checks out the ticket says nothing, not even whose it is.
	if tk, err = keys.VerifySignature(tok); err != nil {
		return admission.Ticket{}, false, err
	}
	if err := tk.Check(req.Sale, req.User, cfg.Name); err != nil {
		return admission.Ticket{}, false, err
	}
	if err := tk.CheckLive(now); err != nil {
		return admission.Ticket{}, true, err
	}
	if tk.SKU != "" && tk.SKU != req.SKU {
		return admission.Ticket{}, true, fmt.Errorf("the ticket is a waitlist offer of %s, not %s: %w", tk.SKU, req.SKU, ErrTicketInvalid)
	}
	return tk, true, nil
}
