package region

import (
	"errors"
	"net/netip"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
)

// gates are what the front door checks before a buyer enters or is admitted, from what the
// region already knows (no state of their own but the token buckets): the bot limits, the
// kill switch and the sold-out flags.
type gates struct {
	r     *Region
	users *admission.Limiter // per buyer
	addrs *admission.Limiter // per client address
}

// closed says why a room admits no one now: its sale is paused, or sold out everywhere (every
// SKU flagged drained by the coordinator); queued buyers hear it at their next poll and new
// ones at once. Neither closes the room: its buyers keep their places, no one is admitted
// meanwhile (admitDue), and once the sale is resumed or units come back (expired or released
// holds beyond what the waitlists take) it admits again, in order.
func (g *gates) closed(t SaleTerms) error {
	if g.salePaused(t.Sale) {
		return closedError(t.Sale, closedPaused)
	}
	if g.soldOutEverywhere(t) {
		return closedError(t.Sale, closedSoldOut)
	}
	return nil
}

// line is closed's answer as a line's feed names it (LineFeed.Gate): GatePaused,
// GateSoldOut or "".
func (g *gates) line(t SaleTerms) string {
	switch err := g.closed(t); {
	case errors.Is(err, ErrPaused):
		return GatePaused
	case err != nil:
		return GateSoldOut
	}
	return ""
}

// salePaused reports whether the whole sale is paused (the kill switch).
func (g *gates) salePaused(sale string) bool {
	s := g.r.paused.Load()
	if s == nil {
		return false
	}
	_, ok := s.reasons[poolKey{sale, ""}]
	return ok
}

// soldOutEverywhere reports whether no SKU of the sale has a unit an open buyer could take:
// each is drained everywhere, or its units here are all set aside for its waitlist (set-aside
// units count as available in the coordinator's flags, which can lower drained for units
// only the waitlist may take).
func (g *gates) soldOutEverywhere(t SaleTerms) bool {
	for _, sku := range t.SKUs {
		pk := poolKey{t.Sale, sku}
		aside := g.r.aside.of(pk)
		avail, _ := g.r.cachedAvailable(pk)
		if !g.drained(t.Sale, sku) && (aside == 0 || avail > aside) {
			return false
		}
	}
	return true
}

// drained reports whether no unit of sku is available anywhere (the coordinator's flag). The
// flags come from etcd and are checked like input: a flag this region's own books contradict
// (units available here) is not believed.
func (g *gates) drained(sale, sku string) bool {
	on := false
	if f := g.r.cfg.Cluster.Drained; f != nil {
		on = f(sale, sku)
	} else {
		on = g.r.cfg.Cluster.SoldOut != nil && g.r.cfg.Cluster.SoldOut(sale, sku)
	}
	if !on {
		return false
	}
	avail, known := g.r.cachedAvailable(poolKey{sale, sku})
	return !known || avail == 0
}

// limiterKey is the per-address bucket of ip: the address itself for IPv4, its /64 for IPv6
// (one host gets a /64, so counting single addresses would let it take a bucket per address).
func limiterKey(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, err := ip.Prefix(64)
	if err != nil { // only for an address of another family, which ParseAddr does not give
		return ip.String()
	}
	return p.String()
}

// limit applies the per-buyer and per-address token buckets.
func (g *gates) limit(user, addr string, now time.Time) error {
	if ok, after := g.users.Allow(user, now); !ok {
		return &apierr.OverloadedError{What: "admissions of buyer " + user, RetryAfter: after}
	}
	if addr == "" {
		return nil
	}
	if ok, after := g.addrs.Allow(addr, now); !ok {
		return &apierr.OverloadedError{What: "admissions from address " + addr, RetryAfter: after}
	}
	return nil
}
