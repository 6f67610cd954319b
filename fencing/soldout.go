package fencing

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Flag names one of the coordinator's stock flags per SKU. They grant or refuse no unit:
// they choose answers (SOLD_OUT or REGION_EXHAUSTED) and whether a waiting room admits now;
// every take is decided by the region's writer.
type Flag string

// The stock flags.
const (
	// SoldOut: no unit of the SKU is left to sell anywhere: no region has one available or
	// held (a hold may expire back into stock), the unallocated pool is empty and no
	// transfer is unfinished. Regions answer SOLD_OUT instead of REGION_EXHAUSTED.
	SoldOut Flag = "soldout"
	// Drained: no unit of the SKU is available anywhere, though some may be held. Waiting
	// rooms tell their buyers the sale is sold out, and buyers may join the SKU's waitlist
	// for the units that come back.
	Drained Flag = "drained"
)

const flagPrefix = "/quota/flags/"

func flagKey(f Flag, sale, sku string) string {
	return flagPrefix + string(f) + "/" + sale + "|" + sku // '|' and '/' are in no valid id (transfer.CheckID)
}

// SetFlag raises (or lowers) flag f of a SKU.
func SetFlag(ctx context.Context, c *Client, f Flag, sale, sku string, on bool) error {
	key := flagKey(f, sale, sku)
	var err error
	if on {
		_, err = c.c.Put(ctx, key, "1")
	} else {
		_, err = c.c.Delete(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("%s flag %s/%s: %w", f, sale, sku, err)
	}
	return nil
}

// WatchFlags calls fn with every flag raised now and then with every change, until ctx ends
// or the watch fails (compacted, canceled by etcd); a flag lowered while no watch ran is not
// reported, so a caller that starts again should read every flag's truth again.
func WatchFlags(ctx context.Context, c *Client, fn func(f Flag, sale, sku string, on bool)) error {
	resp, err := c.c.Get(ctx, flagPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read stock flags: %w", err)
	}
	for _, kv := range resp.Kvs {
		if f, sale, sku, ok := splitFlag(string(kv.Key)); ok {
			fn(f, sale, sku, true)
		}
	}
	wch := c.c.Watch(ctx, flagPrefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch stock flags: %w", err)
		}
		for _, ev := range wr.Events {
			if f, sale, sku, ok := splitFlag(string(ev.Kv.Key)); ok {
				fn(f, sale, sku, ev.Type == clientv3.EventTypePut)
			}
		}
	}
	return ctx.Err()
}

func splitFlag(key string) (f Flag, sale, sku string, ok bool) {
	kind, rest, ok := strings.Cut(strings.TrimPrefix(key, flagPrefix), "/")
	if !ok {
		return "", "", "", false
	}
	i := strings.Index(rest, "|")
	if i <= 0 || i == len(rest)-1 {
		return "", "", "", false
	}
	return Flag(kind), rest[:i], rest[i+1:], true
}
