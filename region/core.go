package region

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/quotaworks/quota/transfer"
)

// Core is a region's decision logic without its database, network or clock: the in-memory
// state and operations the leader's writer runs (reserve, confirm, release, expire: the
// same op values and batch code), the per-sale fence (transfer.Admit) and the transfer
// steps' decisions and effects its SQL operations write (transfer_effects.go), applied to
// maps instead of tables. The deterministic
// simulation (sim) runs each region as a Core; a Clone taken after a commit is
// what a crash leaves behind.
//
// A Core is not safe for concurrent use.
type Core struct {
	name  string
	m     *memState
	sales map[string]SaleTerms
	fence map[string]int64
	in    map[string]transfer.InboundRecord
	out   map[string]transfer.OutboundRecord
	moved map[poolKey]*corePoolBooks
}

// corePoolBooks is the part of a pool's books the writer's memory does not keep (I3).
type corePoolBooks struct{ creditedIn, debitedOut transfer.Units }

// NewCore returns an empty region named name.
func NewCore(name string) *Core {
	return &Core{name: name, m: newMemState(),
		sales: map[string]SaleTerms{}, fence: map[string]int64{}, in: map[string]transfer.InboundRecord{},
		out: map[string]transfer.OutboundRecord{}, moved: map[poolKey]*corePoolBooks{}}
}

// Clone returns an independent copy: the durable image of the region at this moment.
// Holds are shared, not copied: a memHold is replaced, never changed.
func (c *Core) Clone() *Core {
	n := &Core{name: c.name, sales: maps.Clone(c.sales), fence: maps.Clone(c.fence), in: maps.Clone(c.in),
		out: maps.Clone(c.out), moved: make(map[poolKey]*corePoolBooks, len(c.moved))}
	n.m = &memState{pools: make(map[poolKey]*memPool, len(c.m.pools)), users: make(map[userKey]*memUser, len(c.m.users)),
		due: slices.Clone(c.m.due), keys: maps.Clone(c.m.keys), holds: maps.Clone(c.m.holds), keysPer: maps.Clone(c.m.keysPer),
		tickets: maps.Clone(c.m.tickets)}
	for k, p := range c.m.pools {
		cp := *p
		n.m.pools[k] = &cp
	}
	for k, u := range c.m.users {
		cu := *u
		n.m.users[k] = &cu
	}
	for k, b := range c.moved {
		cb := *b
		n.moved[k] = &cb
	}
	return n
}

// Restarted returns the region as a new leader loads it from its durable image: pools,
// sales, fences and transfer records as stored, and per-user counts and deadlines rebuilt
// from the holds by the same code as loadMem (addLoaded), not copied from memory. Unlike
// loadMem it keeps closed holds whole: a Core never retires a hold (archive.go), so the model
// it serves stands for a leader with an unbounded retention.
func (c *Core) Restarted() *Core {
	n := c.Clone()
	n.m.users, n.m.due = map[userKey]*memUser{}, nil
	n.m.keys, n.m.holds = map[keyKey]*memHold{}, map[string]*memHold{}
	for _, id := range slices.Sorted(maps.Keys(c.m.holds)) {
		n.m.addLoaded(c.m.holds[id])
	}
	heap.Init(&n.m.due)
	return n
}

// coreRun applies one writer op in a batch of its own at now and publishes its holds, as a
// committed batch does.
func coreRun[T any](c *Core, now time.Time, o op[T]) (T, error) {
	b := &batch{now: now.Truncate(time.Microsecond), touched: map[poolKey]transfer.Units{}, sales: map[string]SaleTerms{},
		m: c.m, w: newWrites(), overlay: map[string]*memHold{}, keys: map[keyKey]*memHold{}, asideDelta: map[poolKey]transfer.Units{}}
	res, outcome, fatal := o.apply(context.Background(), b)
	if fatal != nil {
		panic(fmt.Sprintf("region core: in-memory op failed: %v", fatal)) // memory ops have no fatal errors
	}
	c.m.publish(b.overlay, now)
	return res, outcome
}

// PutSale records a sale's terms, fenced by the coordinator's generation (I4).
func (c *Core) PutSale(gen int64, t SaleTerms) error {
	if err := CheckTerms(t); err != nil {
		return err
	}
	if err := c.admit(t.Sale, gen); err != nil {
		return err
	}
	if have, ok := c.sales[t.Sale]; ok {
		if !sameTerms(have, t) {
			return fmt.Errorf("sale_id %q is already defined with other terms: %w", t.Sale, ErrAlreadyExists)
		}
		return nil
	}
	c.sales[t.Sale] = t
	return nil
}

// Reserve is Region.Reserve decided by the writer's reserveOp (I1, I2, I3, I6 once the
// caller commits the Core before replying).
func (c *Core) Reserve(now time.Time, req ReserveRequest, holdID string) (ReserveResult, error) {
	if err := CheckReserve(req); err != nil {
		return ReserveResult{}, err
	}
	t, ok := c.sales[req.Sale]
	if !ok {
		return ReserveResult{}, fmt.Errorf("sale_id %q: %w", req.Sale, ErrNotFound)
	}
	if err := checkAgainstTerms(t, req, now); err != nil {
		return ReserveResult{}, err
	}
	res, err := coreRun[reserveAnswer](c, now, &reserveOp{req: req, terms: t, holdID: holdID, region: c.name, exhausted: c.exhausted, maxKeys: DefaultMaxKeysPerUser})
	if err != nil {
		return ReserveResult{}, err
	}
	if res.need != lookupNone {
		panic("region core: a reserve asked for a lookup in SQL") // the core retires and archives nothing
	}
	return res.ReserveResult, nil
}

// ReserveCart is Region.ReserveCart decided by the writer's cartOp (I10, and I1, I2, I3, I6
// for each line); ids are the lines' hold ids.
func (c *Core) ReserveCart(now time.Time, req CartRequest, ids []string) (CartResult, error) {
	if err := CheckCart(req); err != nil {
		return CartResult{}, err
	}
	t, ok := c.sales[req.Sale]
	if !ok {
		return CartResult{}, fmt.Errorf("sale_id %q: %w", req.Sale, ErrNotFound)
	}
	if err := checkCartTerms(t, req, now); err != nil {
		return CartResult{}, err
	}
	if len(ids) != len(req.Lines) {
		panic("region core: a cart needs one hold id per line") // the caller's: a programmer error
	}
	res, err := coreRun[cartAnswer](c, now, &cartOp{reserveOp: reserveOp{req: req.line(0), terms: t, region: c.name, exhausted: c.exhausted,
		maxKeys: DefaultMaxKeysPerUser}, cart: req, hash: cartHash(req.Lines), ids: ids})
	if err != nil {
		return CartResult{}, err
	}
	if res.need != lookupNone {
		panic("region core: a cart asked for a lookup in SQL") // the core retires and archives nothing
	}
	return res.CartResult, nil
}

// ConfirmCart is Region.ConfirmCart decided by the writer's cartCloseOp.
func (c *Core) ConfirmCart(now time.Time, cartID, payment string) (CartCloseResult, error) {
	return coreRun[CartCloseResult](c, now, &cartCloseOp{cart: cartID, ids: c.cartLines(cartID), payment: payment})
}

// ReleaseCart is Region.ReleaseCart decided by the writer's cartCloseOp.
func (c *Core) ReleaseCart(now time.Time, cartID string) (CartCloseResult, error) {
	return coreRun[CartCloseResult](c, now, &cartCloseOp{cart: cartID, ids: c.cartLines(cartID), release: true})
}

// cartLines are the hold ids of a cart's lines, in line order (none: the op answers
// NOT_FOUND).
func (c *Core) cartLines(cartID string) []string {
	var hs []Hold
	for _, h := range c.m.holds {
		if h.CartID == cartID {
			hs = append(hs, h.Hold)
		}
	}
	sortLines(hs)
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.ID
	}
	return ids
}

func (c *Core) exhausted(req ReserveRequest, avail transfer.Units) error {
	return fmt.Errorf("region %s: %d of %s left, %d asked: %w", c.name, avail, req.SKU, req.Quantity, ErrRegionExhausted)
}

// Confirm is Region.Confirm decided by the writer's confirmOp (held → sold before the
// deadline, else a refund; I5, I6).
func (c *Core) Confirm(now time.Time, holdID, payment string) (ConfirmResult, error) {
	res, err := coreRun[ConfirmResult](c, now, &confirmOp{holdID: holdID, payment: payment, region: c.name})
	if err != nil {
		return ConfirmResult{}, err
	}
	return res, nil
}

// Release is Region.Release decided by the writer's releaseOp (held → released, I5).
func (c *Core) Release(now time.Time, holdID string) (Hold, error) {
	res, err := coreRun[Hold](c, now, &releaseOp{holdID: holdID, region: c.name})
	if err != nil {
		return Hold{}, err
	}
	return res, nil
}

// Expire is the sweeper's expireOp: up to limit holds past their deadline at now expire.
func (c *Core) Expire(now time.Time, limit int) int {
	res, _ := coreRun[int](c, now, &expireOp{limit: limit, region: c.name})
	return res
}

// admit raises the sale's fence to gen, or refuses it (I4).
func (c *Core) admit(sale string, gen int64) error {
	next, err := transfer.Admit(c.fence[sale], gen)
	if err != nil {
		return fmt.Errorf("sale %s: %w: %w", sale, err, ErrFenced)
	}
	c.fence[sale] = next
	return nil
}

// Fence is the highest coordinator generation this region has admitted for sale.
func (c *Core) Fence(sale string) int64 { return c.fence[sale] }

func (c *Core) pool(k poolKey) (*memPool, *corePoolBooks) {
	p := c.m.pools[k]
	if p == nil {
		p = &memPool{}
		c.m.pools[k] = p
	}
	b := c.moved[k]
	if b == nil {
		b = &corePoolBooks{}
		c.moved[k] = b
	}
	return p, b
}

// Holds returns every hold, by id.
func (c *Core) Holds() []Hold {
	ids := slices.Sorted(maps.Keys(c.m.holds))
	hs := make([]Hold, len(ids))
	for i, id := range ids {
		hs[i] = c.m.holds[id].Hold
	}
	return hs
}

// EachHold calls f with every hold, in no particular order.
func (c *Core) EachHold(f func(Hold)) {
	for _, h := range c.m.holds {
		f(h.Hold)
	}
}

// HoldByID returns one hold.
func (c *Core) HoldByID(id string) (Hold, bool) {
	h, ok := c.m.holds[id]
	if !ok {
		return Hold{}, false
	}
	return h.Hold, true
}

// Pools returns every pool's counters, ordered by sale then SKU.
func (c *Core) Pools() []CorePool {
	ks := slices.SortedFunc(maps.Keys(c.m.pools), func(a, b poolKey) int {
		return cmp.Or(strings.Compare(a.sale, b.sale), strings.Compare(a.sku, b.sku))
	})
	ps := make([]CorePool, len(ks))
	for i, k := range ks {
		p, b := c.m.pools[k], c.moved[k]
		ps[i] = CorePool{Sale: k.sale, PoolCounts: PoolCounts{SKU: k.sku, Available: p.available, Held: p.held, Sold: p.sold}}
		if b != nil {
			ps[i].CreditedIn, ps[i].DebitedOut = b.creditedIn, b.debitedOut
		}
	}
	return ps
}

// CorePool is one pool of a Core.
type CorePool struct {
	Sale string
	PoolCounts
}

// UserCount is what user holds now and has bought of sale's sku, as the writer counts it.
func (c *Core) UserCount(sale, sku, user string) (held, bought transfer.Units) {
	if u := c.m.users[userKey{sale, sku, user}]; u != nil {
		return u.held, u.bought
	}
	return 0, 0
}

// Books is the region's books of one sale as the auditor reads them from SQL: pool
// counters, the sums over its hold rows, and its transfer records.
func (c *Core) Books(sale string) transfer.RegionBooks {
	rb := transfer.RegionBooks{Region: c.name, Inbound: map[string]transfer.InboundRecord{}, Outbound: map[string]transfer.OutboundRecord{}}
	inHolds := map[string][2]transfer.Units{}
	for _, h := range c.m.holds {
		if h.Sale != sale {
			continue
		}
		s := inHolds[h.SKU]
		switch h.State {
		case Held:
			s[0] += h.Quantity
		case Sold:
			s[1] += h.Quantity
		}
		inHolds[h.SKU] = s
	}
	for _, p := range c.Pools() {
		if p.Sale == sale {
			s := inHolds[p.SKU]
			rb.Pools = append(rb.Pools, transfer.PoolBooks{Sale: sale, SKU: p.SKU, Available: p.Available, Held: p.Held, Sold: p.Sold,
				CreditedIn: p.CreditedIn, DebitedOut: p.DebitedOut, HeldInHolds: s[0], SoldInHolds: s[1]})
		}
	}
	for id, r := range c.in {
		if r.Sale == sale {
			rb.Inbound[id] = r
		}
	}
	for id, r := range c.out {
		if r.Sale == sale {
			rb.Outbound[id] = r
		}
	}
	return rb
}
