package coordinator

import (
	"context"
	"sync"
	"time"

	"github.com/quotaworks/quota/fencing"
)

// The stock flags live in etcd, where only the coordinator's etcd user may write them; what
// comes back from etcd is still checked like input. The leader watches the flags, and a flag
// that differs from what it published (raised or lowered by anyone else, or left by an
// earlier term) sends its sale back to the sold-out loop, which derives the flag again from
// the books and publishes the truth in its next round (SoldOutInterval). A sale whose books
// say sold out is re-derived only after two rounds agree (publishFlag), so a false flag is
// corrected within about three rounds.

// FlagWatcher follows the stock flags: fn with every flag raised now, then with every
// change, until ctx ends or the watch fails (fencing.WatchFlags).
type FlagWatcher func(ctx context.Context, fn func(f fencing.Flag, sale, sku string, on bool)) error

// maxSeenFlags bounds the flags seen between two rounds; beyond it every sale is read again.
const maxSeenFlags = 10000

// seenFlags are the flags the watch saw since the loop last looked, as etcd holds them now.
type seenFlags struct {
	mu       sync.Mutex
	flags    map[flagKey]bool
	overflow bool
	// restarted: the watch started again, and a flag lowered while none ran was not seen.
	restarted bool
}

// restart says the watch starts again.
func (s *seenFlags) restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restarted = true
}

func (s *seenFlags) record(k flagKey, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.flags) >= maxSeenFlags {
		s.overflow = true
		return
	}
	s.flags[k] = on
}

// drain returns what was seen, whether some of it was lost to the bound, and whether the
// watch started again since.
func (s *seenFlags) drain() (map[flagKey]bool, bool, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, overflow, restarted := s.flags, s.overflow, s.restarted
	s.flags, s.overflow, s.restarted = map[flagKey]bool{}, false, false
	return out, overflow, restarted
}

// watchFlags runs the flag watch for the term of ctx, starting it again a second after it
// fails; owned by the coordinator's wait group.
func (sf *stockFlags) watchFlags(ctx context.Context, seen *seenFlags) {
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			seen.restart()
		}
		err := sf.cfg.WatchFlags(ctx, func(f fencing.Flag, sale, sku string, on bool) {
			seen.record(flagKey{f, skuKey{sale, sku}}, on)
		})
		if err != nil && ctx.Err() == nil {
			sf.cfg.Logger.Warn("stock flag watch ended; starting it again", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// checkSeen compares the flags etcd holds with what this term published. A flag that differs
// is forgotten as published and its sale read again, so this round publishes the books' flag;
// a difference this term did not cause is logged. Our own publications come back equal.
func (sf *stockFlags) checkSeen(seen *seenFlags, feed *changeFeed, st flagState) {
	flags, overflow, restarted := seen.drain()
	if overflow || restarted {
		feed.putBack(true, nil)
	}
	if restarted { // what etcd holds is unknown: publish every flag again
		clear(st.published)
	}
	for k, on := range flags {
		prev, ok := st.published[k]
		if ok && prev == on || !ok && !on {
			continue
		}
		if ok { // not a flag of an earlier term: someone else wrote it
			sf.cfg.Logger.Warn("a stock flag in etcd differs from what the coordinator published; deriving it again from the books",
				"flag", k.flag, "sale", k.sale, "sku", k.sku, "in_etcd", on, "published", prev)
		}
		delete(st.published, k)
		feed.again(k.sale)
	}
}
