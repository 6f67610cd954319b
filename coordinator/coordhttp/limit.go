package coordhttp

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
)

// Rate is a token bucket: Burst logins at once, then one every Every.
type Rate struct {
	Burst int
	Every time.Duration
}

// String says the rate as the console's refusals name it.
func (r Rate) String() string { return fmt.Sprintf("%d at once, then one every %s", r.Burst, r.Every) }

// LoginLimits bound how fast logins may come. Each bucket table is per role (refused logins
// apart), so one role's logins can neither spend nor fill another's: an auditor's flood, or
// a stranger's of bad tokens, leaves the operators' buckets as they were.
type LoginLimits struct {
	// PerToken limits one token's logins.
	PerToken Rate
	// PerAddress limits the logins of one role from one client address (an IPv6 client's
	// /64), and apart from them, the refused logins (bad or expired tokens) of an address.
	PerAddress Rate
	// MaxKeys bounds each bucket table. A full table of buckets that have not refilled
	// refuses a new token or address until one has (admission.Limiter fails closed).
	MaxKeys int
}

// DefaultLoginLimits are the console's limits when Options.Limits is nil: a person logs in
// a few times a day; a script that logs in on every call is refused, as is a flood.
var DefaultLoginLimits = LoginLimits{
	PerToken:   Rate{Burst: 10, Every: 6 * time.Second},
	PerAddress: Rate{Burst: 30, Every: 2 * time.Second},
	MaxKeys:    4096,
}

// refusedClass is the bucket table of refused logins, apart from the roles'.
const refusedClass = "refused"

// loginLimiter is the token buckets of LoginLimits: by role for tokens, by role and for
// refused logins for addresses.
type loginLimiter struct {
	lim    LoginLimits
	tokens map[trust.Role]*admission.Limiter
	addrs  map[string]*admission.Limiter
}

// newLoginLimiter checks lim and makes its buckets; an error names the bad field.
func newLoginLimiter(lim LoginLimits) (*loginLimiter, error) {
	for field, r := range map[string]Rate{"Limits.PerToken": lim.PerToken, "Limits.PerAddress": lim.PerAddress} {
		if r.Burst < 1 || r.Burst > 1<<30 || r.Every <= 0 {
			return nil, apierr.Invalid(field, "%+v: want 1 <= Burst <= 2^30 and Every > 0", r)
		}
	}
	if lim.MaxKeys < 1 || lim.MaxKeys > 1<<20 {
		return nil, apierr.Invalid("Limits.MaxKeys", "%d: want 1 to 2^20", lim.MaxKeys)
	}
	bucket := func(r Rate) *admission.Limiter {
		return admission.NewLimiter(float64(time.Second)/float64(r.Every), r.Burst, lim.MaxKeys)
	}
	l := &loginLimiter{lim: lim, tokens: map[trust.Role]*admission.Limiter{}, addrs: map[string]*admission.Limiter{
		refusedClass: bucket(lim.PerAddress)}}
	for _, role := range LoginRoles {
		l.tokens[role] = bucket(lim.PerToken)
		l.addrs[string(role)] = bucket(lim.PerAddress)
	}
	return l, nil
}

// allowLogin spends one of the address's logins of t's role, then one of the token's. The
// error is an OVERLOADED one naming the limit and when to try again.
func (l *loginLimiter) allowLogin(t Token, tok tokenID, remote string, now time.Time) error {
	addr := addressKey(remote)
	if ok, after := l.addrs[string(t.Role)].Allow(addr, now); !ok {
		return limited(fmt.Sprintf("%s logins from address %s (%s)", t.Role, addr, l.lim.PerAddress), after)
	}
	key := base64.RawURLEncoding.EncodeToString(tok[:16])
	if ok, after := l.tokens[t.Role].Allow(key, now); !ok {
		return limited(fmt.Sprintf("logins of the %s token of %s (%s)", t.Role, t.Name, l.lim.PerToken), after)
	}
	return nil
}

// allowRefused spends one of the address's refused logins.
func (l *loginLimiter) allowRefused(remote string, now time.Time) error {
	addr := addressKey(remote)
	if ok, after := l.addrs[refusedClass].Allow(addr, now); !ok {
		return limited(fmt.Sprintf("refused logins from address %s (%s)", addr, l.lim.PerAddress), after)
	}
	return nil
}

// limited is the answer to a login over a limit: 429 OVERLOADED, Retry-After in whole
// seconds (rounded up, at least one).
func limited(what string, after time.Duration) error {
	after = max((after+time.Second-1)/time.Second, 1) * time.Second
	return fmt.Errorf("console login rate limit: %w", &apierr.OverloadedError{What: what, RetryAfter: after})
}

// addressKey is the bucket of a request's remote address: the IPv4 address, an IPv6
// address's /64 (one host gets a /64, so counting single addresses would let it take a
// bucket per address), or the text as given when it is no address.
func addressKey(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return remote
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, err := ip.Prefix(64)
	if err != nil {
		return ip.String()
	}
	return p.String()
}
