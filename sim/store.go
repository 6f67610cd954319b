package sim

import (
	"fmt"
	"slices"

	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

const storeName = "store"

// ackedHold is what the storefronts were told about a hold: as first granted, and the last
// state a reply acknowledged. A terminal state once acknowledged is a promise (I5, I6).
type ackedHold struct {
	hold    region.Hold
	state   region.HoldState
	payment string
}

// keyState is one idempotency key: its request, its region, and the hold it was answered
// with (once it was).
type keyState struct {
	region string
	req    region.ReserveRequest
	hold   string
	// cart is the key's cart, for a cart's key (req is then unused); hold is its cart id.
	cart *region.CartRequest
}

// ask is a storefront request awaiting its answer.
type ask struct {
	kind string
	key  string // reserve, cart
	hold string // confirm, release; the cart id of a cart's confirm or release
}

// storefront is every buyer and the shops they use: it reserves, retries with the same
// key when an answer does not come, confirms and releases, and remembers every answer.
type storefront struct {
	asks     map[int]ask
	keys     map[string]*keyState
	open     []string // keys not answered yet, oldest first
	holds    map[string]*ackedHold
	byRegion map[string][]string // acknowledged holds per region, in order
	live     []string            // acknowledged holds last known held, but carts' lines
	carts    []string            // acknowledged carts, by id, whose line 0 was last known held
	cartOf   map[string]string   // the region of each acknowledged cart
}

func newStorefront() *storefront {
	return &storefront{asks: map[int]ask{}, keys: map[string]*keyState{}, holds: map[string]*ackedHold{}, byRegion: map[string][]string{}, cartOf: map[string]string{}}
}

// act does at most one thing this step.
func (s *storefront) act(w *world) {
	if !w.chance(0.6) {
		return
	}
	switch x := w.rng.Float64(); {
	case x < 0.42:
		s.reserve(w)
	case x < 0.5:
		s.reserveCart(w)
	case x < 0.6 && len(s.open) > 0:
		s.retry(w, pick(w, s.open))
	case x < 0.65 && len(s.carts) > 0:
		c := pick(w, s.carts)
		pay := ""
		if w.chance(0.6) {
			pay = "pay-" + c
		}
		s.send(w, s.cartOf[c], ask{kind: "cart close", hold: c}, func(id int) any { return cartCloseReq{id, c, pay} })
	case x < 0.85 && len(s.live) > 0:
		h := pick(w, s.live)
		s.send(w, s.holds[h].hold.Region, ask{kind: "confirm", hold: h}, func(id int) any { return confirmReq{id, h, "pay-" + h} })
	case len(s.live) > 0:
		h := pick(w, s.live)
		s.send(w, s.holds[h].hold.Region, ask{kind: "release", hold: h}, func(id int) any { return releaseReq{id, h} })
	}
}

func (s *storefront) send(w *world, to string, a ask, body func(id int) any) {
	id := w.nextID()
	s.asks[id] = a
	w.send(storeName, to, body(id))
	w.stats.Ops[a.kind]++
}

func (s *storefront) reserve(w *world) {
	req := region.ReserveRequest{Sale: sale, SKU: w.pickSKU(), User: fmt.Sprintf("u%d", w.rng.IntN(w.cfg.Users)),
		Quantity: transfer.Units(1 + w.rng.IntN(2)), RequestKey: fmt.Sprintf("k%d", w.nextID())}
	key := req.User + "/" + req.RequestKey
	s.keys[key] = &keyState{region: pick(w, w.shape.regions), req: req}
	s.open = append(s.open, key)
	s.retry(w, key)
}

// reserveCart asks for a cart of two SKUs, one or two units each: a step of the model that
// must hold both lines or neither (I10).
func (s *storefront) reserveCart(w *world) {
	a, b := w.pickSKU(), w.pickSKU()
	if a == b {
		b = pick(w, w.shape.skus)
	}
	lines := []region.CartLine{{SKU: a, Quantity: transfer.Units(1 + w.rng.IntN(2))}}
	if a != b {
		lines = append(lines, region.CartLine{SKU: b, Quantity: transfer.Units(1 + w.rng.IntN(2))})
	}
	req := region.CartRequest{Sale: sale, User: fmt.Sprintf("u%d", w.rng.IntN(w.cfg.Users)), RequestKey: fmt.Sprintf("k%d", w.nextID()), Lines: lines}
	key := req.User + "/" + req.RequestKey
	s.keys[key] = &keyState{region: pick(w, w.shape.regions), cart: &req}
	s.open = append(s.open, key)
	s.retry(w, key)
}

// retry sends a key's request (again): the region must answer the same hold (idempotency).
func (s *storefront) retry(w *world, key string) {
	k := s.keys[key]
	if k.cart != nil {
		s.send(w, k.region, ask{kind: "cart", key: key}, func(id int) any { return cartReq{id, *k.cart} })
		return
	}
	s.send(w, k.region, ask{kind: "reserve", key: key}, func(id int) any { return reserveReq{id, k.req} })
}

// receive records an answer and checks it against what was answered before.
func (s *storefront) receive(w *world, m message) {
	rep := m.body.(reply)
	a, ok := s.asks[rep.id]
	delete(s.asks, rep.id)
	if !ok || rep.err != nil {
		return
	}
	switch a.kind {
	case "reserve":
		s.granted(w, a.key, rep.res.(region.ReserveResult).Hold)
	case "confirm":
		s.learn(w, rep.res.(region.ConfirmResult).Hold)
	case "release":
		s.learn(w, rep.res.(region.Hold))
	case "cart":
		s.grantedCart(w, a.key, rep.res.(region.CartResult))
	case "cart close":
		for _, h := range rep.res.(region.CartCloseResult).Holds {
			s.learn(w, h)
		}
		s.carts = slices.DeleteFunc(s.carts, func(c string) bool { return c == a.hold })
	}
}

// grantedCart records a granted cart: its key answers the cart id, each line is an
// acknowledged hold (I6), and the cart is confirmed or released whole.
func (s *storefront) grantedCart(w *world, key string, res region.CartResult) {
	k := s.keys[key]
	if k.hold != "" && k.hold != res.CartID {
		w.failf("I6", "request key %s answered cart %s, then cart %s", key, k.hold, res.CartID)
		return
	}
	if len(res.Holds) != len(k.cart.Lines) {
		w.failf("I10", "cart %s of key %s granted with %d holds for %d lines", res.CartID, key, len(res.Holds), len(k.cart.Lines))
		return
	}
	if k.hold == "" {
		k.hold = res.CartID
		s.open = slices.DeleteFunc(s.open, func(o string) bool { return o == key })
		s.carts = append(s.carts, res.CartID)
		s.cartOf[res.CartID] = res.Holds[0].Region
	}
	for _, h := range res.Holds {
		if _, ok := s.holds[h.ID]; !ok {
			s.holds[h.ID] = &ackedHold{hold: h, state: region.Held}
			s.byRegion[h.Region] = append(s.byRegion[h.Region], h.ID)
		}
		s.learn(w, h)
	}
}

func (s *storefront) granted(w *world, key string, h region.Hold) {
	k := s.keys[key]
	if k.hold != "" && k.hold != h.ID {
		w.failf("I6", "request key %s answered hold %s, then hold %s", key, k.hold, h.ID)
		return
	}
	if k.hold == "" {
		k.hold = h.ID
		for i, o := range s.open {
			if o == key {
				s.open = append(s.open[:i], s.open[i+1:]...)
				break
			}
		}
	}
	if _, ok := s.holds[h.ID]; !ok {
		s.holds[h.ID] = &ackedHold{hold: h, state: region.Held}
		s.byRegion[h.Region] = append(s.byRegion[h.Region], h.ID)
		s.live = append(s.live, h.ID)
	}
	s.learn(w, h)
}

// learn records a hold's state as a reply acknowledged it. Replies come late and out of
// order: an older "held" after a terminal state is stale, but two different terminal
// states acknowledged for one hold break I5.
func (s *storefront) learn(w *world, h region.Hold) {
	a := s.holds[h.ID]
	if a == nil || h.State == region.Held {
		return
	}
	if a.state != region.Held && a.state != h.State {
		w.failf("I5", "hold %s acknowledged %s, then %s", h.ID, a.state, h.State)
		return
	}
	if a.state == region.Held {
		a.state, a.payment = h.State, h.PaymentID
		for i, id := range s.live {
			if id == h.ID {
				s.live = append(s.live[:i], s.live[i+1:]...)
				break
			}
		}
	}
}
