package fencing

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const soldOutPrefix = "/quota/soldout/"

// SetSoldOut publishes (or lifts) the flag saying a SKU has no unit available anywhere: no
// region's pool, the unallocated pool, or a transfer in flight. Regions answer SOLD_OUT
// instead of REGION_EXHAUSTED while it is set. It is advice for the answer only; no decision
// to grant or refuse stock depends on it.
func SetSoldOut(ctx context.Context, c *Client, sale, sku string, soldOut bool) error {
	key := soldOutPrefix + sale + "|" + sku // '|' is in no valid id (transfer.CheckID)
	var err error
	if soldOut {
		_, err = c.c.Put(ctx, key, "1")
	} else {
		_, err = c.c.Delete(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("sold-out flag %s/%s: %w", sale, sku, err)
	}
	return nil
}

// WatchSoldOut calls fn with the current sold-out flags and then with every change, until
// ctx ends.
func WatchSoldOut(ctx context.Context, c *Client, fn func(sale, sku string, soldOut bool)) error {
	resp, err := c.c.Get(ctx, soldOutPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read sold-out flags: %w", err)
	}
	for _, kv := range resp.Kvs {
		if sale, sku, ok := splitFlag(string(kv.Key)); ok {
			fn(sale, sku, true)
		}
	}
	wch := c.c.Watch(ctx, soldOutPrefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		for _, ev := range wr.Events {
			if sale, sku, ok := splitFlag(string(ev.Kv.Key)); ok {
				fn(sale, sku, ev.Type == clientv3.EventTypePut)
			}
		}
	}
	return ctx.Err()
}

func splitFlag(key string) (sale, sku string, ok bool) {
	rest := strings.TrimPrefix(key, soldOutPrefix)
	i := strings.Index(rest, "|")
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}
