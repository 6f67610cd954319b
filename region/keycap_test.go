package region_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
)

// TestKeysPerUserAreCapped: a buyer who reserves and releases with a fresh key each time
// (what grew the leader without bound) is refused TOO_MANY_KEYS at the cap; a retry of a used
// key is still answered, another buyer is not affected, and the count survives a takeover.
// (A warm standby's copy counts the same: sameCaughtUp in the standby tests compares it with
// a full load.)
func TestKeysPerUserAreCapped(t *testing.T) {
	const keyCap = 5
	e := newEnv(t, func(c *region.Config) { c.MaxKeysPerUser = keyCap })
	e.sale(defaultTerms(testSale, 2), 100)
	var first region.Hold
	for i := range keyCap {
		h := e.mustReserve("mallory", "k"+strconv.Itoa(i), 1)
		if i == 0 {
			first = h
		}
		if _, err := e.r.Release(e.ctx, h.ID); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		if _, err := e.reserve("mallory", "k-new", 1); !errors.Is(err, apierr.ErrTooManyKeys) {
			t.Errorf("%s: a new key past the cap: %v; want TOO_MANY_KEYS", when, err)
		}
		if res, err := e.reserve("mallory", "k0", 1); err != nil || !res.Replayed || res.Hold.ID != first.ID {
			t.Errorf("%s: a retry of a used key: %+v, %v; want the first hold replayed", when, res, err)
		}
		if _, err := e.reserve("alice", "k-"+when, 1); err != nil {
			t.Errorf("%s: another buyer: %v", when, err)
		}
	}
	check("leading")
	e.takeOver()
	check("takeover")
}
