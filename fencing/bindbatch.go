package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotaworks/quota/internal/apierr"
)

// A Binder writes its binds in batches: one goroutine (run) owns the writing, takes every
// bind queued while its last transaction was in flight, up to MaxBindBatch, and writes them
// in one etcd transaction: if none of the keys was ever created, put them all (each on its
// sale's lease), else read them all. When the transaction succeeds every bind in it is
// recorded. When it fails, the reads say which keys exist, and what region each names: those
// binds are answered with it (a record is never rewritten), and the others go into the next
// transaction. Each failed transaction answers at least one bind, so none is tried more than
// MaxBindBatch times. A caller waits for its answer no longer than its context; the record is
// in etcd (committed, so on a majority's disk) before the caller hears its region.

// MaxBindBatch is how many binds one etcd transaction carries at most: etcd's default
// --max-txn-ops (128) bounds the comparisons, the puts and the reads of one transaction.
const MaxBindBatch = 128

// MaxBindQueue is how many binds may wait for a Binder's transaction at most; a bind beyond
// is refused ErrBindQueueFull.
const MaxBindQueue = 4096

// maxBindTxnTime bounds one batch's etcd transaction; it ends sooner when every caller in it
// has a deadline that comes sooner.
const maxBindTxnTime = 5 * time.Second

// ErrBindQueueFull is a bind refused because MaxBindQueue binds are waiting already; it is
// apierr.ErrOverloaded (nothing was written: try again).
var ErrBindQueueFull = &apierr.OverloadedError{What: "the binding queue", RetryAfter: 100 * time.Millisecond}

// bindReq is one bind waiting for a batch. res has room for its answer, so the batch never
// waits for a caller that left.
type bindReq struct {
	ctx    context.Context // the caller's
	key    string
	region string
	lease  LeaseID
	res    chan bindRes
}

// bindRes is a bind's answer: the region recorded, or why there is none.
type bindRes struct {
	bound string
	err   error
}

// enqueue queues r for a batch and waits for its answer, no longer than r.ctx.
func (b *Binder) enqueue(r *bindReq) (string, error) {
	select {
	case <-b.stop:
		return "", ErrBinderClosed
	default:
	}
	select {
	case b.queue <- r:
	default:
		return "", ErrBindQueueFull
	}
	select {
	case res := <-r.res:
		return res.bound, res.err
	case <-r.ctx.Done():
		return "", fmt.Errorf("waiting for the binding write: %w", r.ctx.Err())
	case <-b.done: // closed: the queue was drained before, or r came after
		select {
		case res := <-r.res:
			return res.bound, res.err
		default:
			return "", ErrBinderClosed
		}
	}
}

// run writes the queued binds in batches until Close, then answers those still queued
// ErrBinderClosed. It is the Binder's one goroutine.
func (b *Binder) run() {
	defer close(b.done)
	var pending []*bindReq // binds a failed transaction left unanswered: first in the next
	for {
		if len(pending) == 0 {
			select {
			case r := <-b.queue:
				pending = append(pending, r)
			case <-b.stop:
				b.drain()
				return
			}
		}
	fill:
		for len(pending) < MaxBindBatch {
			select {
			case r := <-b.queue:
				pending = append(pending, r)
			default:
				break fill
			}
		}
		pending = b.commit(pending, true)
	}
}

// drain answers every queued bind ErrBinderClosed. Close has closed b.stop, so Bind queues
// no more unless it passed that check just before; such a bind hears of b.done instead.
func (b *Binder) drain() {
	for {
		select {
		case r := <-b.queue:
			r.res <- bindRes{err: ErrBinderClosed}
		default:
			return
		}
	}
}

// commit writes batch (its callers still waiting) in one etcd transaction, answers the binds
// it settles, and returns those left for the next: binds of keys that were absent when the
// transaction failed because another key of the batch exists. split says a transaction
// failing for a lease that does not exist may be tried again once per lease, to find whose.
func (b *Binder) commit(batch []*bindReq, split bool) []*bindReq {
	live, keys := dedupBinds(batch)
	if len(keys) == 0 {
		return nil
	}
	b.txns.Add(1)
	resp, err := b.txn(keys, live)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) && split && len(leasesOf(keys)) > 1 {
		var left []*bindReq
		for _, group := range byLease(live) {
			left = append(left, b.commit(group, false)...)
		}
		return left
	}
	if err != nil {
		answerAll(live, bindRes{err: fmt.Errorf("bind %d buyers: %w", len(keys), err)})
		return nil
	}
	if resp.Succeeded {
		for _, r := range live {
			r.res <- bindRes{bound: keys[r.key].region}
		}
		return nil
	}
	left := answerExisting(live, resp)
	if len(left) == len(live) { // etcd read none of the keys that made it fail: never so
		answerAll(live, bindRes{err: fmt.Errorf("bind %d buyers: the transaction failed and read no record", len(keys))})
		return nil
	}
	return left
}

// dedupBinds drops the binds whose caller left (answering them) and returns the others with
// each key's first bind: its region and lease are the ones written. etcd refuses a
// transaction that writes one key twice.
func dedupBinds(batch []*bindReq) (live []*bindReq, keys map[string]*bindReq) {
	keys = make(map[string]*bindReq, len(batch))
	live = batch[:0:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.res <- bindRes{err: err}
			continue
		}
		live = append(live, r)
		if _, ok := keys[r.key]; !ok {
			keys[r.key] = r
		}
	}
	return live, keys
}

// txn is the batch's transaction: if no key of keys was ever created, put them all, else
// read them all. It lasts no longer than the latest deadline of the callers in live (none
// later than maxBindTxnTime) and ends at Close.
func (b *Binder) txn(keys map[string]*bindReq, live []*bindReq) (*clientv3.TxnResponse, error) {
	limit := time.Now().Add(maxBindTxnTime)
	var latest time.Time
	for _, r := range live {
		if d, ok := r.ctx.Deadline(); !ok || d.After(limit) {
			latest = limit
			break
		} else if d.After(latest) {
			latest = d
		}
	}
	ctx, cancel := context.WithDeadline(b.ctx, latest)
	defer cancel()
	cmps := make([]clientv3.Cmp, 0, len(keys))
	puts := make([]clientv3.Op, 0, len(keys))
	gets := make([]clientv3.Op, 0, len(keys))
	for key, r := range keys {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		var opts []clientv3.OpOption
		if r.lease != NoLease {
			opts = append(opts, clientv3.WithLease(clientv3.LeaseID(r.lease)))
		}
		puts = append(puts, clientv3.OpPut(key, r.region, opts...))
		gets = append(gets, clientv3.OpGet(key))
	}
	return b.send(ctx, func(c *Client, ctx context.Context) (*clientv3.TxnResponse, error) {
		return c.c.Txn(ctx).If(cmps...).Then(puts...).Else(gets...).Commit()
	})
}

// nearTry bounds a transaction through the near member (and so does half the time its
// callers give it); nearRest is how long binds are then written through every member after
// it failed.
const (
	nearTry  = time.Second
	nearRest = 10 * time.Second
)

// send runs txn through the near member when the Binder has one that has not failed in the
// last nearRest, and through every member otherwise or when that fails. The near member gets
// at most half of ctx's time, so a member that is frozen (it answers nothing) leaves the
// other half for every member. Sending it again is safe: a transaction puts keys only if they
// were never created and else reads them, so one that committed through near unbeknown to us
// reads what it wrote.
func (b *Binder) send(ctx context.Context, txn func(*Client, context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	if b.near != nil && time.Now().UnixNano() >= b.nearOff.Load() {
		try := nearTry
		if d, ok := ctx.Deadline(); ok {
			try = min(try, time.Until(d)/2)
		}
		nctx, cancel := context.WithTimeout(ctx, try)
		resp, err := txn(b.near, nctx)
		cancel()
		if err == nil {
			b.viaNear.Add(1)
		}
		if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || ctx.Err() != nil {
			return resp, err
		}
		b.nearOff.Store(time.Now().Add(nearRest).UnixNano())
	}
	return txn(b.c, ctx)
}

// answerExisting answers each bind of live whose key the failed transaction resp read (the
// region recorded) and returns the others, whose keys were absent.
func answerExisting(live []*bindReq, resp *clientv3.TxnResponse) (left []*bindReq) {
	found := make(map[string]string, len(resp.Responses))
	for _, op := range resp.Responses {
		for _, kv := range op.GetResponseRange().GetKvs() {
			found[string(kv.Key)] = string(kv.Value)
		}
	}
	for _, r := range live {
		region, ok := found[r.key]
		switch {
		case !ok:
			left = append(left, r)
		case region == "":
			r.res <- bindRes{err: fmt.Errorf("bind %s: record exists but reads empty", r.key)}
		default:
			r.res <- bindRes{bound: region}
		}
	}
	return left
}

// answerAll answers every bind of rs res.
func answerAll(rs []*bindReq, res bindRes) {
	for _, r := range rs {
		r.res <- res
	}
}

// leasesOf is the set of leases the binds of keys carry.
func leasesOf(keys map[string]*bindReq) map[LeaseID]bool {
	ls := make(map[LeaseID]bool)
	for _, r := range keys {
		ls[r.lease] = true
	}
	return ls
}

// byLease groups rs by the lease they carry.
func byLease(rs []*bindReq) map[LeaseID][]*bindReq {
	g := make(map[LeaseID][]*bindReq)
	for _, r := range rs {
		g[r.lease] = append(g[r.lease], r)
	}
	return g
}
