package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/quotaworks/quota/transfer"
	"github.com/redis/go-redis/v9"
)

// takeScript is a storefront's flash-sale take in Redis, one unit or more of one SKU for one
// user, atomic because Redis runs a script alone:
//
//   - a request already taken replays: the same hold again (or a conflict when the key was
//     used for another SKU or quantity), nothing taken twice;
//   - the (sale, user) count plus the quantity must stay within the per-user limit;
//   - the stock key of (sale, SKU) must hold at least the quantity;
//   - then the stock is decremented, the user's count incremented, the hold written as a hash
//     (user, request key, SKU, quantity, state, expiry) and indexed by expiry in a sorted set (what an
//     expiry sweeper reads), and the request recorded with a TTL so that a retry replays.
//
// KEYS: stock, user count, request, hold, expiry index. ARGV: quantity, per-user limit, hold
// TTL (ms), request record TTL (ms), user, SKU, request key. Reply: {code, hold key}, code one of the
// take* constants.
const takeScript = `
local q = tonumber(ARGV[1])
local fp = ARGV[6] .. '/' .. ARGV[1]
local prev = redis.call('GET', KEYS[3])
if prev then
  if prev == fp then return {1, KEYS[4]} end
  return {4, ''}
end
local had = tonumber(redis.call('GET', KEYS[2]) or '0')
if had + q > tonumber(ARGV[2]) then return {3, ''} end
local stock = tonumber(redis.call('GET', KEYS[1]))
if not stock then return redis.error_reply('NO_SUCH_SKU ' .. KEYS[1]) end
if stock < q then return {2, ''} end
local t = redis.call('TIME')
local expires = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('DECRBY', KEYS[1], q)
redis.call('INCRBY', KEYS[2], q)
redis.call('HSET', KEYS[4], 'user', ARGV[5], 'request', ARGV[7], 'sku', ARGV[6], 'qty', q, 'state', 'held', 'expires_at', expires)
redis.call('ZADD', KEYS[5], expires, KEYS[4])
redis.call('SET', KEYS[3], fp, 'PX', ARGV[4])
return {0, KEYS[4]}
`

// The take script's answers.
const (
	takeNew      = 0 // a new hold
	takeReplay   = 1 // the request was taken before: its hold again
	takeSoldOut  = 2 // not enough stock
	takeLimit    = 3 // the user's limit would be passed
	takeConflict = 4 // the request key was used for another request
)

// The Redis variants' sale: the same shape as the region's (one SKU, a per-user limit of 1,
// holds of one hour), keys hash-tagged by sale so that a cluster would keep them in one slot.
const (
	redisPerUserLimit = 1
	redisHoldTTL      = time.Hour
	redisRequestTTL   = 24 * time.Hour
	redisCallTimeout  = 30 * time.Second // one take, pool wait included
)

// redisKeys names a sale's keys.
type redisKeys struct{ sale, sku string }

func (k redisKeys) stock() string  { return "q:{" + k.sale + "}:stock:" + k.sku }
func (k redisKeys) expiry() string { return "q:{" + k.sale + "}:holds:by-expiry" }
func (k redisKeys) user(u string) string {
	return "q:{" + k.sale + "}:user:" + u
}
func (k redisKeys) request(u, key string) string { return "q:{" + k.sale + "}:req:" + u + ":" + key }
func (k redisKeys) hold(u, key string) string    { return "q:{" + k.sale + "}:hold:" + u + ":" + key }
func (k redisKeys) userPattern() string          { return "q:{" + k.sale + "}:user:*" }

// redisTaker runs the take script against one server through a pool of connections.
type redisTaker struct {
	client *redis.Client
	script *redis.Script
	keys   redisKeys
}

// newRedisTaker opens conns connections to addr (all of them before it returns, so that
// none is dialled while the clock runs) and loads the take script.
func newRedisTaker(ctx context.Context, addr string, conns int) (*redisTaker, error) {
	t := &redisTaker{client: redis.NewClient(&redis.Options{Addr: addr, PoolSize: conns, MaxActiveConns: conns, MinIdleConns: conns,
		PoolTimeout: redisCallTimeout, DialTimeout: 5 * time.Second, ReadTimeout: redisCallTimeout, WriteTimeout: redisCallTimeout,
		ContextTimeoutEnabled: true, MaxRetries: -1, DisableIdentity: true, ConnMaxIdleTime: -1}),
		script: redis.NewScript(takeScript), keys: redisKeys{sale: benchSale, sku: benchSKU}}
	if err := t.open(ctx, conns); err != nil {
		_ = t.Close()
		return nil, err
	}
	return t, nil
}

// redisDialWait bounds how long the pool may take to open its connections.
const redisDialWait = 30 * time.Second

// open loads the script and waits until the pool has opened conns connections (it dials
// MinIdleConns of them in the background).
func (t *redisTaker) open(ctx context.Context, conns int) error {
	if err := t.script.Load(ctx, t.client).Err(); err != nil {
		return fmt.Errorf("load the take script: %w", err)
	}
	deadline := time.Now().Add(redisDialWait)
	for int(t.client.PoolStats().TotalConns) < conns {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis pool: %d of %d connections open after %s", t.client.PoolStats().TotalConns, conns, redisDialWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis pool: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// Close closes the pool's connections; it may be called more than once.
func (t *redisTaker) Close() error {
	if err := t.client.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("close redis client: %w", err)
	}
	return nil
}

// setStock puts units in the SKU's stock key, overwriting what was there.
func (t *redisTaker) setStock(ctx context.Context, units transfer.Units) error {
	if err := t.client.Set(ctx, t.keys.stock(), int64(units), 0).Err(); err != nil {
		return fmt.Errorf("set stock: %w", err)
	}
	return nil
}

// take runs the script once for user's request key and returns its answer and hold key.
func (t *redisTaker) take(ctx context.Context, user, key string, sku string, units transfer.Units) (int64, string, error) {
	ctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	defer cancel()
	k := redisKeys{sale: t.keys.sale, sku: sku}
	res, err := t.script.EvalSha(ctx, t.client, []string{k.stock(), k.user(user), k.request(user, key), k.hold(user, key), k.expiry()},
		int64(units), redisPerUserLimit, redisHoldTTL.Milliseconds(), redisRequestTTL.Milliseconds(), user, sku, key).Slice()
	if err != nil {
		return 0, "", fmt.Errorf("take script: %w", err)
	}
	if len(res) != 2 {
		return 0, "", fmt.Errorf("take script: answer %v, want {code, hold}", res)
	}
	code, ok1 := res[0].(int64)
	hold, ok2 := res[1].(string)
	if !ok1 || !ok2 {
		return 0, "", fmt.Errorf("take script: answer %#v, want {int, string}", res)
	}
	return code, hold, nil
}

// attempt is one caller's take of one unit as user prefix<n> with request key "k", as (d)
// reserves: a new hold is taken, sold out a refusal, any other answer an error.
func (t *redisTaker) attempt(prefix string) attempt {
	return func(ctx context.Context, n int64) (outcome, error) {
		code, _, err := t.take(ctx, prefix+strconv.FormatInt(n, 10), "k", benchSKU, 1)
		switch {
		case err != nil:
			return failed, err
		case code == takeNew:
			return took, nil
		case code == takeSoldOut:
			return refused, nil
		}
		return failed, fmt.Errorf("take answered %d for a new user", code)
	}
}

// redisVariant is (g) or (h): the take script on a redis-server whose append-only file is
// fsynced as fsync says.
type redisVariant struct {
	name, label, fsync string
}

func (c *Config) redisVariants() []redisVariant {
	var vs []redisVariant
	if c.wants(VariantRedisAlways) {
		vs = append(vs, redisVariant{name: VariantRedisAlways, fsync: "always", label: "Redis Lua take, appendfsync always (durable)"})
	}
	if c.wants(VariantRedisEverysec) {
		vs = append(vs, redisVariant{name: VariantRedisEverysec, fsync: "everysec", label: "Redis Lua take, appendfsync everysec"})
	}
	return vs
}

// runRedis runs one Redis variant on a redis-server of its own, started for it and stopped
// before it returns (also on error): cfg.Stock units, cfg.Concurrency callers, each with a
// connection of its own, until sold out; then the books are checked on the server.
func runRedis(ctx context.Context, cfg *Config, v redisVariant) (res VariantResult, err error) {
	cfg.progress("(%s) %s: starting redis-server", v.name, v.label)
	srv, err := startRedis(ctx, cfg.RedisServer, v.fsync, cfg.Concurrency+32)
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := srv.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	t, err := newRedisTaker(ctx, srv.addr, cfg.Concurrency)
	if err != nil {
		return res, err
	}
	defer t.Close()
	if err := t.setStock(ctx, cfg.Stock); err != nil {
		return res, err
	}
	cfg.progress("(%s) running", v.name)
	prefix := v.name + strconv.FormatUint(cfg.Seed, 10) + "-"
	cpu0, ok0 := srv.cpu()
	res = cfg.stockLoad(func(int) attempt { return t.attempt(prefix) }).run(ctx)
	if cpu1, ok1 := srv.cpu(); ok0 && ok1 && res.Ops > 0 {
		res.ServerCPUPerOp = round1(float64(cpu1-cpu0) / float64(time.Microsecond) / float64(res.Ops))
	}
	res.Variant, res.Label, res.Stock = v.name, v.label, cfg.Stock
	b, err := t.books(ctx)
	if err != nil {
		return res, err
	}
	res.HoldRows, res.Remaining = b.holds, b.remaining
	res.checkUnits(true)
	res.addProblems(b.problems(res.HoldRows)...)
	if len(b.problems(res.HoldRows)) == 0 && res.HoldRows > 0 {
		res.addProblems(t.checkRetry(ctx, b.remaining)...)
	}
	return res, nil
}

// addProblems adds what else disagreed to Check.
func (v *VariantResult) addProblems(problems ...string) {
	switch {
	case len(problems) == 0:
	case v.Check == "ok":
		v.Check = fmt.Sprint(problems)
	default:
		v.Check += " " + fmt.Sprint(problems)
	}
}

// redisBooks is what a Redis variant left on its server.
type redisBooks struct {
	remaining transfer.Units
	holds     int64 // entries of the expiry index: one per hold, each of one unit
	users     int64 // (sale, user) count keys
	userUnits int64 // their sum
	overLimit int64 // how many are above the per-user limit
}

// problems says what in the books disagrees with holds: every held unit counted for a user,
// no user above the limit.
func (b redisBooks) problems(holds int64) []string {
	var out []string
	if b.userUnits != holds {
		out = append(out, fmt.Sprintf("users' counts add up to %d, holds %d", b.userUnits, holds))
	}
	if b.overLimit > 0 {
		out = append(out, fmt.Sprintf("%d users above the limit of %d", b.overLimit, redisPerUserLimit))
	}
	return out
}

// redisScanCount is how many keys one SCAN call looks at.
const redisScanCount = 1000

// books reads the stock left, the holds in the expiry index and every user's count.
func (t *redisTaker) books(ctx context.Context) (b redisBooks, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rem, err := t.client.Get(ctx, t.keys.stock()).Int64()
	if err != nil {
		return b, fmt.Errorf("read stock: %w", err)
	}
	b.remaining = transfer.Units(rem)
	if b.holds, err = t.client.ZCard(ctx, t.keys.expiry()).Result(); err != nil {
		return b, fmt.Errorf("count holds: %w", err)
	}
	size, err := t.client.DBSize(ctx).Result()
	if err != nil {
		return b, fmt.Errorf("dbsize: %w", err)
	}
	var cursor uint64
	for calls := 2*size/redisScanCount + 100; calls > 0; calls-- { // SCAN visits every key in about size/count calls
		keys, next, err := t.client.ScanType(ctx, cursor, t.keys.userPattern(), redisScanCount, "string").Result()
		if err != nil {
			return b, fmt.Errorf("scan users: %w", err)
		}
		if err := t.addUsers(ctx, keys, &b); err != nil {
			return b, err
		}
		if cursor = next; cursor == 0 {
			return b, nil
		}
	}
	return b, fmt.Errorf("scan users: not done after %d calls over %d keys", 2*size/redisScanCount+100, size)
}

// addUsers adds the counts of keys to b.
func (t *redisTaker) addUsers(ctx context.Context, keys []string, b *redisBooks) error {
	if len(keys) == 0 {
		return nil
	}
	vals, err := t.client.MGet(ctx, keys...).Result()
	if err != nil {
		return fmt.Errorf("read users' counts: %w", err)
	}
	for i, v := range vals {
		s, _ := v.(string)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("user count %s = %v: %w", keys[i], v, err)
		}
		b.users++
		b.userUnits += n
		if n > redisPerUserLimit {
			b.overLimit++
		}
	}
	return nil
}

// checkRetry takes the first hold of the expiry index again as its buyer would retry it:
// the same request replays its hold, the same key for another SKU is a conflict, a new key
// of the same buyer passes the limit; none of them may take stock (remaining before).
func (t *redisTaker) checkRetry(ctx context.Context, remaining transfer.Units) []string {
	first, err := t.client.ZRange(ctx, t.keys.expiry(), 0, 0).Result()
	if err != nil || len(first) != 1 {
		return []string{fmt.Sprintf("read the first hold: %v %v", first, err)}
	}
	h, err := t.client.HMGet(ctx, first[0], "user", "request").Result()
	if err != nil || len(h) != 2 {
		return []string{fmt.Sprintf("read hold %s: %v %v", first[0], h, err)}
	}
	user, _ := h[0].(string)
	key, _ := h[1].(string)
	if user == "" || key == "" {
		return []string{fmt.Sprintf("hold %s has user %q, request %q", first[0], user, key)}
	}
	var out []string
	for _, tc := range []struct {
		key, sku string
		want     int64
		hold     string
	}{{key, benchSKU, takeReplay, first[0]}, {key, "other", takeConflict, ""}, {key + "-again", benchSKU, takeLimit, ""}} {
		code, hold, err := t.take(ctx, user, tc.key, tc.sku, 1)
		if err != nil || code != tc.want || hold != tc.hold {
			out = append(out, fmt.Sprintf("retry of %s key %s sku %s answered %d %q (%v), want %d %q", user, tc.key, tc.sku, code, hold, err, tc.want, tc.hold))
		}
	}
	if rem, err := t.client.Get(ctx, t.keys.stock()).Int64(); err != nil || transfer.Units(rem) != remaining {
		out = append(out, fmt.Sprintf("stock %d after the retries (%v), want %d", rem, err, remaining))
	}
	return out
}

// findRedis, when (g) or (h) will run, finds redis-server before anything runs (so a
// missing one fails the run at once) and records its version.
func (c *Config) findRedis(ctx context.Context, s *Setup) error {
	if !c.wants(VariantRedisAlways, VariantRedisEverysec) {
		return nil
	}
	path, err := redisServerPath(c.RedisServer)
	if err != nil {
		return fmt.Errorf("variants g, h: %w", err)
	}
	c.RedisServer = path
	if s.RedisServer, err = redisVersion(ctx, path); err != nil {
		return fmt.Errorf("variants g, h: %w", err)
	}
	s.Placement += RedisPlacement
	return nil
}
