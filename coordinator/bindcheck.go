package coordinator

import (
	"context"
	"slices"
	"time"
)

// Bindings are the buyers' bindings to regions as etcd holds them (fencing.FollowBindings,
// fencing.Unbind). Only region processes and the coordinator may write them there; what
// comes back is still checked like input: a binding to a region that does not exist would
// turn its buyer away at every region (BOUND_ELSEWHERE naming nowhere).
type Bindings struct {
	// Follow calls fn with every binding there is, then every binding written, until ctx ends
	// or it fails.
	Follow func(ctx context.Context, fn func(sale, user, region string)) error
	// Unbind removes a binding if it still names region, reporting whether it did.
	Unbind func(ctx context.Context, sale, user, region string) (bool, error)
	// Bound reads the region a buyer is bound to for a sale, and false when none is recorded
	// (AuditLimits names it for each offender).
	Bound func(ctx context.Context, sale, user string) (string, bool, error)
}

// bindCheckLoop removes, while this coordinator leads, every binding that names no region of
// the cluster, and logs each: the buyer may then be bound again, to a real region, at their
// next admission. Owned by the coordinator's wait group; the watch starts again a second
// after it fails.
func (sf *stockFlags) bindCheckLoop(ctx context.Context) {
	if sf.cfg.Bindings.Follow == nil || sf.cfg.Bindings.Unbind == nil {
		return
	}
	regions := sf.regions.names()
	for ctx.Err() == nil {
		err := sf.cfg.Bindings.Follow(ctx, func(sale, user, region string) {
			switch {
			case slices.Contains(regions, region):
			case user == "":
				sf.cfg.Logger.Warn("a binding's key names no buyer; left as it is", "key_sale_part", sale, "region", region)
			default:
				sf.unbindForeign(ctx, sale, user, region)
			}
		})
		if err != nil && ctx.Err() == nil {
			sf.cfg.Logger.Warn("binding watch ended; starting it again", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// unbindForeign removes one binding to a region that does not exist, and says so.
func (sf *stockFlags) unbindForeign(ctx context.Context, sale, user, region string) {
	uctx, cancel := context.WithTimeout(ctx, sf.cfg.CallTimeout)
	defer cancel()
	removed, err := sf.cfg.Bindings.Unbind(uctx, sale, user, region)
	if err != nil {
		sf.cfg.Logger.Error("a binding names a region that does not exist, and removing it failed", "sale", sale, "user", user,
			"region", region, "err", err)
		return
	}
	if removed { // else it changed since it was read: it names something else now
		sf.cfg.Logger.Warn("a binding named a region that does not exist; removed", "sale", sale, "user", user, "region", region)
	}
}
