package region

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// A cart is several lines (SKU, quantity) reserved at once, all or nothing (I10): one hold per
// line, made in one writer step, sharing a cart id, which is line 0's hold id. Each line is an
// ordinary hold from there on (confirm, expiry, the archive, the audit, the per-user counts
// and the demand all see it as one), but for two rules: a line's request key is the cart's
// followed by '#' and the line's index (lineKey: a client's key cannot hold '#', so no
// client key collides), and a line is confirmed or released only with its cart
// (ConfirmCart, ReleaseCart), so a cart is bought or given back whole too.
//
// The cart id is stored in its lines' cart_id column (migration 00015), indexed, so a cart's
// lines are found by one index read, in holds and in the archive alike; the request-key
// prefix would find them too, but only through the buyer's key range and only once the
// buyer is known.

// MaxCartLines is the most lines one cart may have.
const MaxCartLines = 16

// maxCartKeyLen is the longest request key a cart may have: its lines' keys (lineKey) add
// '#' and up to two digits and stay within transfer.MaxIDLen.
const maxCartKeyLen = transfer.MaxIDLen - 3

// CartLine is one line of a cart: Quantity units of SKU.
type CartLine struct {
	SKU      string
	Quantity transfer.Units
}

// CartRequest asks for every line of a cart for User, all or nothing, idempotent by
// RequestKey (a retry with other lines is ALREADY_EXISTS). One SKU appears on one line at
// most.
type CartRequest struct {
	Sale       string
	User       string
	RequestKey string
	Lines      []CartLine
	// Ticket is the admission ticket, in a sale with a waiting room: it backs one cart (line
	// 0's hold carries its admission). A waitlist offer's ticket reserves its SKU alone.
	Ticket string
	// Token, when set, is Ticket as its caller read it (ReserveRequest.Token).
	Token *admission.Token
}

// CartResult is a granted cart: one hold per line, in the request's order, each with CartID,
// line 0's hold id. Replayed is true when RequestKey matched an earlier identical cart.
type CartResult struct {
	CartID   string
	Holds    []Hold
	Replayed bool
}

// CartError is a cart refused with no line held: every line refused, and why. Unwrap gives
// the first, so the answer's code is that line's (SOLD_OUT, REGION_EXHAUSTED, ...).
type CartError struct {
	Lines []*apierr.LineError
}

// Error lists the refused lines.
func (e *CartError) Error() string {
	parts := make([]string, len(e.Lines))
	for i, l := range e.Lines {
		parts[i] = l.Error()
	}
	return "cart refused, no line held: " + strings.Join(parts, "; ")
}

// Unwrap is the first refused line.
func (e *CartError) Unwrap() error { return e.Lines[0] }

// CartCloseResult is a cart confirmed or released: its holds in line order. For a confirm,
// Sold says the payment bought every line; else Reason says why it must be refunded (no line
// was sold to it).
type CartCloseResult struct {
	CartID string
	Holds  []Hold
	Sold   bool
	Reason string
}

// lineKey is line i's request key in the cart of request key key: line 0 keeps the cart's
// own key, so a single reserve and a cart can never both be granted under one key (each
// finds the other's hold and its request hash differs: ALREADY_EXISTS, I6); line i > 0 adds
// '#' and i.
func lineKey(key string, i int) string {
	if i == 0 {
		return key
	}
	return key + "#" + strconv.Itoa(i)
}

// lineIndex is the line a cart line's request key names: 0 for a key without '#' (line 0's),
// -1 for a malformed one.
func lineIndex(key string) int {
	_, n, ok := strings.Cut(key, "#")
	if !ok {
		return 0
	}
	i, err := strconv.Atoi(n)
	if err != nil || i < 0 {
		return -1
	}
	return i
}

// line is line i as a reserve of its own, as every check of a single hold reads it.
func (req CartRequest) line(i int) ReserveRequest {
	l := req.Lines[i]
	return ReserveRequest{Sale: req.Sale, SKU: l.SKU, User: req.User, Quantity: l.Quantity,
		RequestKey: lineKey(req.RequestKey, i), Ticket: req.Ticket, Token: req.Token}
}

// cartHash fingerprints a whole cart, stored as every line's request hash, so a retry with
// other lines is told apart from the same cart (and from a single reserve: no SKU holds '#').
func cartHash(lines []CartLine) [16]byte {
	h := sha256.New()
	buf := make([]byte, 0, 64)
	buf = append(buf, "#cart"...)
	for _, l := range lines {
		buf = strconv.AppendInt(append(append(append(buf[:0], 0), l.SKU...), 0), int64(l.Quantity), 10)
		h.Write(buf)
	}
	return [16]byte(h.Sum(nil)[:16])
}

// CheckCart validates a cart's fields on their own, naming the first bad one: 1 to
// MaxCartLines lines, each a valid SKU and quantity, no SKU twice.
func CheckCart(req CartRequest) error {
	if err := checkIDs("sale_id", req.Sale, "user_id", req.User, "request_key", req.RequestKey); err != nil {
		return err
	}
	if len(req.RequestKey) > maxCartKeyLen {
		return apierr.Invalid("request_key", "a cart's request key is at most %d bytes, got %d", maxCartKeyLen, len(req.RequestKey))
	}
	switch n := len(req.Lines); {
	case n == 0:
		return apierr.Invalid("lines", "a cart needs at least one line")
	case n > MaxCartLines:
		return apierr.Invalid("lines", "%d lines, more than the %d a cart may have", n, MaxCartLines)
	}
	seen := make(map[string]int, len(req.Lines))
	for i, l := range req.Lines {
		f := "lines[" + strconv.Itoa(i) + "]."
		if err := checkIDs(f+"sku", l.SKU); err != nil {
			return err
		}
		if err := checkQuantity(f+"quantity", l.Quantity); err != nil {
			return err
		}
		if j, dup := seen[l.SKU]; dup {
			return apierr.Invalid(f+"sku", "%s is lines[%d]'s too: one line per SKU", l.SKU, j)
		}
		seen[l.SKU] = i
	}
	return nil
}

// checkCartTerms is checkAgainstTerms for every line, naming the line.
func checkCartTerms(t SaleTerms, req CartRequest, now time.Time) error {
	for i, l := range req.Lines {
		if l.Quantity > t.PerUserLimit {
			return apierr.Invalid(fmt.Sprintf("lines[%d].quantity", i), "%d is over the per-user limit %d", l.Quantity, t.PerUserLimit)
		}
		if err := checkAgainstTerms(t, req.line(i), now); err != nil {
			return &apierr.LineError{Line: i, SKU: l.SKU, Err: err}
		}
	}
	return nil
}

// Carts reserves, confirms and releases the carts of region R, through its front door D when
// it has one (nil: none). A value of its own, so that the Region and the Door keep one job
// each.
type Carts struct {
	R *Region
	D *Door
}

// Reserve holds every line of a cart for req.User, or none (I10), durable before it returns
// (I6). Bad input changes nothing and names the field. The answer is counted once
// (Config.Metrics), and each line refused for want of stock adds to the demand. Through the
// front door, a ticket's admission ends with the cart that used it, as Door.Reserve ends it.
func (c Carts) Reserve(ctx context.Context, req CartRequest) (CartResult, error) {
	if c.D != nil {
		lr := ReserveRequest{Ticket: req.Ticket, Token: req.Token}
		if lr.token() != nil {
			if _, err := c.D.ensureLoaded(ctx); err != nil {
				return CartResult{}, err
			}
			req.Token = lr.Token
		}
	}
	r := c.R
	res, err := reserveCart(ctx, r, req)
	r.cfg.Metrics.Reserved(err)
	var ce *CartError
	if errors.As(err, &ce) {
		for _, l := range ce.Lines {
			r.demand.count(req.line(l.Line), l.Err)
		}
	}
	if err == nil && c.D != nil && res.Holds[0].Admission != "" {
		endAdmission(c.D, req.Sale, res.Holds[0].Admission)
	}
	return res, err
}

// endAdmission ends an admission whose ticket a hold (or a cart's line 0) was made with at
// d: its live place is freed for the next buyer.
func endAdmission(d *Door, sale, admission string) {
	d.mu.Lock()
	sr := d.rooms[sale]
	d.mu.Unlock()
	if sr != nil {
		sr.room.Used(admission)
	}
}

// reserveCart is Carts.Reserve, uncounted: Region.reserve's steps for a cart, its line 0
// standing for it where one request is asked about (the ticket, the binding, the key).
func reserveCart(ctx context.Context, r *Region, req CartRequest) (CartResult, error) {
	if err := CheckCart(req); err != nil {
		return CartResult{}, err
	}
	t, err := r.terms(ctx, req.Sale)
	if err != nil {
		return CartResult{}, err
	}
	now := r.cfg.Clock.Now()
	if err := checkCartTerms(t, req, now); err != nil {
		return CartResult{}, err
	}
	w, err := r.writer()
	if err != nil {
		return CartResult{}, err
	}
	first := req.line(0)
	k := keyKey{req.Sale, req.User, first.RequestKey}
	admitted, vouched, err := checkTicket(&r.cfg, t, first, now)
	if err == nil && admitted.SKU != "" {
		err = fmt.Errorf("the ticket is a waitlist offer of %s: it reserves that SKU alone, not a cart: %w", admitted.SKU, ErrTicketInvalid)
	}
	if err != nil {
		if m := r.state.Load(); vouched && m != nil && !r.inWriter(k) {
			if prior, ok := m.committedKey(k); ok {
				return replayCartStored(ctx, r, prior, req)
			}
		}
		return CartResult{}, err
	}
	if err := r.binds.elsewhere(first.Sale, first.User); err != nil {
		return CartResult{}, err
	}
	unbound, err := r.binds.buyer(ctx, t, first, r.paused.Load())
	if err != nil {
		return CartResult{}, err
	}
	o := &cartOp{reserveOp: reserveOp{req: first, terms: t, region: r.cfg.Name, exhausted: r.exhausted,
		maxKeys: r.cfg.MaxKeysPerUser, ticket: admitted, unbound: unbound}, cart: req, hash: cartHash(req.Lines)}
	for range req.Lines {
		o.ids = append(o.ids, newHoldID(&r.cfg))
	}
	return cartLookingUp(ctx, r, w, k, o)
}

// cartAnswer is the writer's answer to a cart: its result, or the lookup to make first.
type cartAnswer struct {
	CartResult
	need lookup
}

// cartLookingUp is reserveLookingUp for a cart, whose line 0's key is the cart's.
func cartLookingUp(ctx context.Context, r *Region, w *writer, k keyKey, o *cartOp) (CartResult, error) {
	need := lookupNone
	if m := r.state.Load(); m != nil {
		if _, ok := m.committedKey(k); !ok {
			need = m.lookupFor(k)
		}
	}
	for lookups := 0; ; lookups++ {
		if need != lookupNone {
			if lookups == maxLookups {
				return CartResult{}, fmt.Errorf("%w: the region's state was reloaded while the request was looked up", ErrUnknownOutcome)
			}
			if err := r.lookUpArchived(ctx, o.req, k, &o.reserveOp, need == lookupBuyer); err != nil {
				return CartResult{}, err
			}
			if o.replay != nil {
				return replayCartStored(ctx, r, o.replay, o.cart)
			}
		}
		r.track(k, 1)
		ans, err := submitThen[cartAnswer](ctx, w, o, func() { r.track(k, -1) })
		if err != nil || ans.need == lookupNone {
			return ans.CartResult, err
		}
		need = ans.need
	}
}

// replayCartStored answers a cart whose line 0 is prior with the cart as stored: the same
// cart gets its holds back, another one ALREADY_EXISTS.
func replayCartStored(ctx context.Context, r *Region, prior *memHold, req CartRequest) (CartResult, error) {
	if err := sameCart(prior, req); err != nil {
		return CartResult{}, err
	}
	hs, err := readCart(ctx, r.pool, r.cfg.Name, prior.CartID)
	if err != nil {
		return CartResult{}, err
	}
	return CartResult{CartID: prior.CartID, Holds: hs, Replayed: true}, nil
}

// sameCart is nil when the cart whose line 0 is prior is req's, ALREADY_EXISTS when the key
// was used for other lines or for no cart.
func sameCart(prior *memHold, req CartRequest) error {
	if prior.CartID == "" || prior.hash != cartHash(req.Lines) {
		return fmt.Errorf("request_key %q was used for a different request: %w", req.RequestKey, ErrAlreadyExists)
	}
	return nil
}

// cartOp is a cart's all-or-nothing take, decided by the single writer. reserveOp is line 0
// as a reserve of its own: the buyer's and key's lookups, the ticket and the binding are
// its.
type cartOp struct {
	reserveOp
	cart CartRequest
	hash [16]byte
	ids  []string // the lines' hold ids; ids[0] is the cart id
}

// apply checks every line (pause, pool, per-user limit) and the buyer's keys before it takes
// any, so a refused cart changes nothing and nothing needs undoing (I10); then every line is
// taken in this batch, as reserveOp.apply takes one (I1, I2, I3, I6).
func (o *cartOp) apply(_ context.Context, b *batch) (cartAnswer, error, error) {
	req := o.req
	k := keyKey{req.Sale, req.User, req.RequestKey}
	if prior, ok := b.key(k); ok {
		return o.replayIn(b, prior)
	}
	if need := o.lookupNeeded(b, k); need != lookupNone {
		return cartAnswer{need: need}, nil, nil
	}
	if a := o.ticket.Admission; a != "" && b.m.ticketUsedBy(req.Sale, a, req.RequestKey) {
		return cartAnswer{}, fmt.Errorf("admission %s's ticket already backs another request_key: %w", a, ErrTicketUsed), nil
	}
	// The lines' refusals (a pause among them) come before the binding's, as in reserveOp.
	if err := o.refusals(b); err != nil {
		return cartAnswer{}, err, nil
	}
	if o.unbound {
		return cartAnswer{}, fmt.Errorf("sale %s was resumed while the cart was on its way, its buyer not yet bound to this region: %w",
			req.Sale, ErrAborted), nil
	}
	if n := b.m.keysPer[saleUser{req.Sale, req.User}]; n+int32(len(o.cart.Lines)) > o.maxKeys {
		return cartAnswer{}, fmt.Errorf("user %s has used %d request keys in sale %s here; a cart of %d lines would pass the %d a buyer may: %w",
			req.User, n, req.Sale, len(o.cart.Lines), o.maxKeys, apierr.ErrTooManyKeys), nil
	}
	res := CartResult{CartID: o.ids[0], Holds: make([]Hold, len(o.cart.Lines))}
	for i, l := range o.cart.Lines {
		h := &memHold{Hold: Hold{ID: o.ids[i], Region: o.region, Sale: req.Sale, SKU: l.SKU, User: req.User, Quantity: l.Quantity,
			RequestKey: lineKey(o.cart.RequestKey, i), State: Held, CreatedAt: b.now, ExpiresAt: b.now.Add(o.terms.HoldTTL),
			CartID: o.ids[0]}, hash: o.hash}
		if i == 0 {
			h.Admission = o.ticket.Admission // one ticket backs one cart: its admission is on line 0 alone
		}
		b.take(h)
		res.Holds[i] = h.Hold
	}
	return cartAnswer{CartResult: res}, nil, nil
}

// refusals checks every line against the batch's state, changing nothing but the pools'
// touched marks: a CartError with each refused line, or nil when every line can be taken.
func (o *cartOp) refusals(b *batch) error {
	var refused []*apierr.LineError
	for i, l := range o.cart.Lines {
		lr := o.cart.line(i)
		if err := o.lineRefusal(b, lr); err != nil {
			refused = append(refused, &apierr.LineError{Line: i, SKU: l.SKU, Err: err})
		}
	}
	if len(refused) > 0 {
		return &CartError{Lines: refused}
	}
	return nil
}

// lineRefusal is why line lr cannot be taken now, or nil.
func (o *cartOp) lineRefusal(b *batch, lr ReserveRequest) error {
	if err := b.m.paused.refuse(lr); err != nil {
		return err
	}
	pk := poolKey{lr.Sale, lr.SKU}
	p := b.m.pools[pk]
	if p == nil {
		return o.exhausted(lr, 0)
	}
	if free := p.available - b.asideNow(pk, p.available); free < lr.Quantity {
		b.touched[pk] = p.available
		return o.exhausted(lr, free)
	}
	var used transfer.Units
	if u := b.m.users[userKey{lr.Sale, lr.SKU, lr.User}]; u != nil {
		used = u.held + u.bought
	}
	if used+lr.Quantity > o.terms.PerUserLimit {
		return fmt.Errorf("user %s has %d of %s, limit %d: %w", lr.User, used, lr.SKU, o.terms.PerUserLimit, ErrLimitExceeded)
	}
	return nil
}

// replayIn answers a cart whose line 0 this batch sees (prior): the same cart gets its holds
// back from memory, or, when a line has left memory, from SQL (lookupKey: the caller reads
// line 0 and then the cart).
func (o *cartOp) replayIn(b *batch, prior *memHold) (cartAnswer, error, error) {
	if err := sameCart(prior, o.cart); err != nil {
		return cartAnswer{}, err, nil
	}
	res := CartResult{CartID: prior.CartID, Holds: make([]Hold, len(o.cart.Lines)), Replayed: true}
	for i := range o.cart.Lines {
		h, ok := b.key(keyKey{o.req.Sale, o.req.User, lineKey(o.cart.RequestKey, i)})
		if !ok {
			return cartAnswer{need: lookupKey}, nil, nil
		}
		res.Holds[i] = h.Hold
	}
	return cartAnswer{CartResult: res}, nil, nil
}
