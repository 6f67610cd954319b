package fencing

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

// The bind record is what makes a buyer's per-user limit hold across regions: a buyer is
// admitted to a sale at the one region recorded for them, and every other region refuses
// them naming it. The record is written once and never changed; it goes only when the lease
// it carries expires, after the sale's retention.
const bindPrefix = "/quota/bind/"

// DefaultBindRetention is how long bind records last when NewBinder is given no retention.
const DefaultBindRetention = 7 * 24 * time.Hour

// MaxBindLeases is how many sales' leases a Binder remembers at most. A sale it forgot gets a
// new lease on its next bind; records already written keep the lease they carry.
const MaxBindLeases = 1024

// MaxBindsPerLease is how many bind records a Binder attaches to one lease at most; the sale's
// next bind gets a new lease. With authentication on, etcd checks the writer's permission for
// every key already on a lease each time another is put on it (and for every bind attempt,
// even one that only reads the record back): a lease shared by all of a sale's buyers makes
// each bind cost as many checks as there are buyers, and the sale's binds quadratic.
const MaxBindsPerLease = 256

// LeaseID names an etcd lease a bind record is attached to; NoLease attaches none.
type LeaseID int64

// NoLease attaches a bind record to no lease: it lasts until deleted by hand.
const NoLease LeaseID = 0

// ErrBinderClosed is returned by a Binder's methods after Close.
var ErrBinderClosed = errors.New("binder closed")

// bindKey is the record's key. '|' is in no valid id (transfer.CheckID), so no two (sale,
// user) pairs share a key.
func bindKey(sale, user string) string { return bindPrefix + sale + "|" + user }

// checkBind says why sale, user or (when withRegion) region cannot be bound, naming the
// field.
func checkBind(sale, user, region string, withRegion bool) error {
	if why := transfer.CheckID(sale); why != "" {
		return apierr.Invalid("sale", "%s", why)
	}
	if why := transfer.CheckID(user); why != "" {
		return apierr.Invalid("user", "%s", why)
	}
	if !withRegion {
		return nil
	}
	if why := transfer.CheckRegion(region); why != "" {
		return apierr.Invalid("region", "%s", why)
	}
	return nil
}

// Bind records that user is bound to region for sale, if no region is recorded yet, and
// returns the region recorded: this one, or the one that came first. The record is written
// once, in one etcd transaction (if the key was never created, put it; else read it), so
// regions binding the same buyer at once all get the same answer. The record carries lease
// unless it is NoLease; a lease that no longer exists fails the bind (rpctypes'
// ErrLeaseNotFound).
func Bind(ctx context.Context, c *Client, sale, user, region string, lease LeaseID) (bound string, err error) {
	if err := checkBind(sale, user, region, true); err != nil {
		return "", err
	}
	key := bindKey(sale, user)
	var opts []clientv3.OpOption
	if lease != NoLease {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(lease)))
	}
	resp, err := c.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, region, opts...)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return "", fmt.Errorf("bind %s/%s to %s: %w", sale, user, region, err)
	}
	if resp.Succeeded {
		return region, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 || len(kvs[0].Value) == 0 {
		return "", fmt.Errorf("bind %s/%s: record exists but reads empty", sale, user)
	}
	return string(kvs[0].Value), nil
}

// Bound returns the region user is bound to for sale, and false when none is recorded.
func Bound(ctx context.Context, c *Client, sale, user string) (string, bool, error) {
	if err := checkBind(sale, user, "", false); err != nil {
		return "", false, err
	}
	resp, err := c.c.Get(ctx, bindKey(sale, user))
	if err != nil {
		return "", false, fmt.Errorf("read binding of %s/%s: %w", sale, user, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	return string(resp.Kvs[0].Value), true, nil
}

// Binder binds buyers to regions (Bind) with each sale's records on one lease, so they vanish
// after the retention. Concurrent binds, of any sales, are written together, up to
// MaxBindBatch in one etcd transaction (bindbatch.go), by one goroutine the Binder owns until
// Close. It grants a sale's lease on the sale's first bind and remembers it, for
// at most MaxBindLeases sales (the least recently used is forgotten first). It never revokes a
// lease: that would drop every binding of the sale. Safe for concurrent use.
type Binder struct {
	c         *Client
	retention time.Duration
	// near, when set, is a client of the region's own etcd member only: binds are written
	// through it first (bindbatch.go, send), and through c for nearRest after it failed.
	near    *Client
	nearOff atomic.Int64 // unix nanoseconds until which binds skip near
	viaNear atomic.Uint64

	// The batch writer (bindbatch.go): run's context, ended by Close; the binds waiting;
	// stop, closed by Close; done, closed when run has returned; the transactions sent.
	ctx       context.Context
	cancel    context.CancelFunc
	queue     chan *bindReq
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	txns      atomic.Uint64

	mu     sync.Mutex
	closed bool
	leases map[string]*list.Element // sale -> element of lru holding a *saleLease
	lru    *list.List               // front: most recently used
}

// saleLease is a sale's lease, or the grant of it in flight (ready not yet closed).
type saleLease struct {
	sale    string
	ready   chan struct{}
	id      LeaseID
	expires time.Time // no earlier than etcd's expiry of the lease
	err     error
	used    atomic.Int64 // binds given this lease, up to MaxBindsPerLease
}

// NewBinder returns a Binder writing through c whose records last at least retention after
// their bind (DefaultBindRetention when retention <= 0) and at most about 1.5 × retention.
// It starts the Binder's batch writer: Close stops it. Closing the Binder does not close c.
func NewBinder(c *Client, retention time.Duration) *Binder {
	return newBinder(c, nil, retention, MaxBindQueue)
}

// NewBinderNear is NewBinder writing its binds through near first: a client of the region's
// own etcd member only. c's client spreads its calls over every member, some of them an
// ocean away; a member forwards a write to the raft leader either way, so the write through
// the member near by crosses the ocean fewer times. When a write through near fails (its
// member down, frozen, or slower than nearTry or half the time its callers give it), the
// Binder writes through c, and does so for the next nearRest. near nil: NewBinder. The Binder
// does not close near.
func NewBinderNear(c, near *Client, retention time.Duration) *Binder {
	return newBinder(c, near, retention, MaxBindQueue)
}

// newBinder is NewBinderNear with room for queued binds.
func newBinder(c, near *Client, retention time.Duration, queued int) *Binder {
	if retention <= 0 {
		retention = DefaultBindRetention
	}
	if retention < 2*time.Second {
		retention = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Binder{c: c, near: near, retention: retention, ctx: ctx, cancel: cancel, queue: make(chan *bindReq, queued),
		stop: make(chan struct{}), done: make(chan struct{}), leases: make(map[string]*list.Element), lru: list.New()}
	go b.run()
	return b
}

// Bind binds user to region for sale if no region is recorded yet and returns the region
// recorded (see Bind), with the record on the sale's lease. It waits for the batch its bind
// is written in, no longer than ctx; it answers only once the record is in etcd. A bind
// beyond the MaxBindQueue waiting is refused ErrBindQueueFull.
func (b *Binder) Bind(ctx context.Context, sale, user, region string) (string, error) {
	if err := checkBind(sale, user, region, true); err != nil {
		return "", err
	}
	for attempt := 0; ; attempt++ {
		sl, err := b.lease(ctx, sale)
		if err != nil {
			return "", err
		}
		r := &bindReq{ctx: ctx, key: bindKey(sale, user), region: region, lease: sl.id, res: make(chan bindRes, 1)}
		bound, err := b.enqueue(r)
		if err == nil && bound == "" {
			err = fmt.Errorf("bind %s/%s: etcd answered no region", sale, user)
		}
		if err == nil || attempt > 0 || !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return bound, err
		}
		b.forget(sl) // revoked or expired behind our back: grant a new one, once
	}
}

// NearTxns is how many of Txns were answered through the near member (NewBinderNear).
func (b *Binder) NearTxns() uint64 { return b.viaNear.Load() }

// Txns is how many etcd transactions the Binder has sent to write binds (grants of leases
// aside): with binds written in batches, fewer than the binds.
func (b *Binder) Txns() uint64 { return b.txns.Load() }

// Bound returns the region user is bound to for sale, and false when none is recorded. It
// only reads.
func (b *Binder) Bound(ctx context.Context, sale, user string) (string, bool, error) {
	if b.isClosed() {
		return "", false, ErrBinderClosed
	}
	return Bound(ctx, b.c, sale, user)
}

// Close makes the Binder refuse further calls, ends the batch writer (a transaction in
// flight is cut; the binds waiting are answered ErrBinderClosed) and waits for it, and
// forgets its leases without revoking them: the records keep them until they expire.
// Idempotent; always nil.
func (b *Binder) Close() error {
	b.mu.Lock()
	b.closed = true
	b.leases = make(map[string]*list.Element)
	b.lru.Init()
	b.mu.Unlock()
	b.closeOnce.Do(func() {
		close(b.stop)
		b.cancel()
	})
	<-b.done
	return nil
}

func (b *Binder) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// lease returns sale's lease, granting it when the Binder has none, only one that expires
// within the retention, or one that has MaxBindsPerLease binds. One caller grants; the others
// wait for its answer.
func (b *Binder) lease(ctx context.Context, sale string) (*saleLease, error) {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, ErrBinderClosed
		}
		if el, ok := b.leases[sale]; ok {
			sl := el.Value.(*saleLease)
			b.lru.MoveToFront(el)
			b.mu.Unlock()
			select {
			case <-sl.ready:
			case <-ctx.Done():
				return nil, fmt.Errorf("lease for sale %s: %w", sale, ctx.Err())
			}
			if sl.err == nil && sl.expires.Sub(time.Now()) >= b.retention && sl.used.Add(1) <= MaxBindsPerLease {
				return sl, nil
			}
			b.forget(sl) // too old, full, or its grant failed (with the granter's ctx): grant anew
			continue
		}
		sl := &saleLease{sale: sale, ready: make(chan struct{})}
		b.remember(sl)
		b.mu.Unlock()
		b.grant(ctx, sl)
		if sl.err != nil {
			b.forget(sl)
			return nil, sl.err
		}
		sl.used.Add(1)
		return sl, nil
	}
}

// grant asks etcd for sl's lease, with a TTL of 1.5 × retention, and closes sl.ready.
func (b *Binder) grant(ctx context.Context, sl *saleLease) {
	defer close(sl.ready)
	ttl := b.retention + b.retention/2
	start := time.Now()
	resp, err := b.c.c.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		sl.err = fmt.Errorf("grant bind lease for sale %s: %w", sl.sale, err)
		return
	}
	sl.id = LeaseID(resp.ID)
	sl.expires = start.Add(time.Duration(resp.TTL) * time.Second)
}

// remember adds sl as the most recently used, forgetting the least recently used beyond
// MaxBindLeases. b.mu is held.
func (b *Binder) remember(sl *saleLease) {
	b.leases[sl.sale] = b.lru.PushFront(sl)
	for b.lru.Len() > MaxBindLeases {
		old := b.lru.Back()
		b.lru.Remove(old)
		delete(b.leases, old.Value.(*saleLease).sale)
	}
}

// forget drops sl if it is still the sale's lease.
func (b *Binder) forget(sl *saleLease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el, ok := b.leases[sl.sale]; ok && el.Value.(*saleLease) == sl {
		b.lru.Remove(el)
		delete(b.leases, sl.sale)
	}
}

// bindScanPage is how many bindings FollowBindings reads per request.
const bindScanPage = 1000

// bindScanPause is the pause between two pages of FollowBindings' read: a coordinator that
// takes over in the middle of a sale reads every binding without crowding out the regions'
// binds.
const bindScanPause = 20 * time.Millisecond

// FollowBindings calls fn with every binding there is, read in pages, then with every
// binding written from then on, until ctx ends or the watch fails. The watch starts from the
// first page's revision, so a binding written during the read is reported (perhaps twice);
// later pages read the newest data, so a long read meets no compaction. A binding's key that
// does not parse is passed with an empty user.
func FollowBindings(ctx context.Context, c *Client, fn func(sale, user, region string)) error {
	from, end := bindPrefix, clientv3.GetPrefixRangeEnd(bindPrefix)
	var rev int64
	for {
		resp, err := c.c.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(bindScanPage))
		if err != nil {
			return fmt.Errorf("read bindings: %w", err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			sale, user := splitBind(string(kv.Key))
			fn(sale, user, string(kv.Value))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(bindScanPause):
		}
	}
	wch := c.c.Watch(ctx, bindPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch bindings: %w", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				sale, user := splitBind(string(ev.Kv.Key))
				fn(sale, user, string(ev.Kv.Value))
			}
		}
	}
	return ctx.Err()
}

// splitBind is the sale and user of a binding's key ("" when it does not parse).
func splitBind(key string) (sale, user string) {
	rest := key[len(bindPrefix):]
	for i := 0; i < len(rest); i++ {
		if rest[i] == '|' {
			return rest[:i], rest[i+1:]
		}
	}
	return rest, ""
}

// Unbind removes the binding of user for sale if it still names region; it reports whether
// it did. Only a binding naming a region that does not exist is removed (by the coordinator
// leader): a true binding is written once and never changed.
func Unbind(ctx context.Context, c *Client, sale, user, region string) (bool, error) {
	key := bindKey(sale, user)
	resp, err := c.c.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", region)).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return false, fmt.Errorf("unbind %s/%s from %s: %w", sale, user, region, err)
	}
	return resp.Succeeded, nil
}
