package region

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/quotaworks/quota/transfer"
)

// readCache is what requests read without the writer: the leader's committed state (its
// holds by key are readable from any goroutine), the reserves of each key on their way
// through the writer, each pool's committed available count, the sales' terms, the SOLD_OUT
// answers and the committed pauses. Together they let an empty pool answer without the
// writer and, but for a key whose hold has left memory (archive.go), without SQL. The writer
// fills it after each commit (learn), a takeover or a reload replaces it (publish), and
// stepping down empties it (forget).
type readCache struct {
	cfg  *Config
	pool *pgxpool.Pool

	state        atomic.Pointer[memState]
	inWriterMu   sync.Mutex
	inWriterKeys map[keyKey]int

	availMu sync.RWMutex
	avail   map[poolKey]*atomic.Int64
	sales   sync.Map // sale id → SaleTerms
	// soldOut holds the SOLD_OUT answer of each SKU flagged gone (exhausted), made once:
	// every later buyer of the SKU gets the same error.
	soldOut soldOutErrors
	// paused is the leader's committed pauses (pause.go), for the answers given without the
	// writer (an empty pool's); nil when not leading.
	paused atomic.Pointer[pauseSet]
}

func newReadCache(cfg *Config, pool *pgxpool.Pool) *readCache {
	return &readCache{cfg: cfg, pool: pool, avail: map[poolKey]*atomic.Int64{}, inWriterKeys: map[keyKey]int{}}
}

// publish makes m, just loaded, what requests read, with its pools' counts; the sales' terms
// are read again when next asked.
func (r *readCache) publish(m *memState) {
	fresh := make(map[poolKey]*atomic.Int64, len(m.pools))
	for k, p := range m.pools {
		v := &atomic.Int64{}
		v.Store(int64(p.available))
		fresh[k] = v
	}
	r.state.Store(m) // holds before availability: an empty-pool answer never pairs new counts with old holds
	r.availMu.Lock()
	r.avail = fresh
	r.availMu.Unlock()
	r.sales.Clear()
	r.paused.Store(m.paused)
}

// learn runs on the writer after a commit: the cache learns what is now durable.
func (r *readCache) learn(b *batch) {
	r.availMu.Lock()
	for k, a := range b.touched {
		v, ok := r.avail[k]
		if !ok {
			v = &atomic.Int64{}
			r.avail[k] = v
		}
		v.Store(int64(a))
	}
	r.availMu.Unlock()
	r.paused.Store(b.m.paused) // the pauses this batch committed, if it changed them
	for id, t := range b.sales {
		r.sales.Store(id, t)
	}
}

// forget drops the caches that answer without the writer, so nothing is answered from a
// state that may be wrong: requests fall through to the writer (and NOT_LEADER).
func (r *readCache) forget() {
	// Availability first: with the state gone but a count left, a retry of a reserve whose
	// hold exists would be told the pool is empty (the reverse of reload's order).
	r.availMu.Lock()
	r.avail = map[poolKey]*atomic.Int64{}
	r.availMu.Unlock()
	r.state.Store(nil)
	r.paused.Store(nil)
}

// cachedAvailable returns the committed available count of a pool, and whether it is known.
func (r *readCache) cachedAvailable(k poolKey) (transfer.Units, bool) {
	r.availMu.RLock()
	v, ok := r.avail[k]
	r.availMu.RUnlock()
	if !ok {
		return 0, false
	}
	return transfer.Units(v.Load()), true
}

// exhausted is the answer to a reserve this region's pool cannot satisfy: SOLD_OUT when the
// coordinator has flagged the SKU gone everywhere, REGION_EXHAUSTED (retry elsewhere or
// later) otherwise.
func (r *readCache) exhausted(req ReserveRequest, avail transfer.Units) error {
	if r.cfg.Cluster.SoldOut != nil && r.cfg.Cluster.SoldOut(req.Sale, req.SKU) {
		return r.soldOut.of(poolKey{req.Sale, req.SKU})
	}
	return fmt.Errorf("region %s: %d of %s left, %d asked: %w", r.cfg.Name, avail, req.SKU, req.Quantity, ErrRegionExhausted)
}

// track counts the reserves of a key on their way through the writer.
func (r *readCache) track(k keyKey, d int) {
	r.inWriterMu.Lock()
	defer r.inWriterMu.Unlock()
	if r.inWriterKeys[k] += d; r.inWriterKeys[k] == 0 {
		delete(r.inWriterKeys, k)
	}
}

// inWriter reports whether a reserve of key k is on its way through the writer.
func (r *readCache) inWriter(k keyKey) bool {
	r.inWriterMu.Lock()
	defer r.inWriterMu.Unlock()
	return r.inWriterKeys[k] > 0
}

// terms returns a sale's terms from the cache or the database.
func (r *readCache) terms(ctx context.Context, sale string) (SaleTerms, error) {
	if t, ok := r.sales.Load(sale); ok {
		return t.(SaleTerms), nil
	}
	t, err := readTerms(ctx, r.pool, sale)
	if err != nil {
		return t, err
	}
	r.sales.Store(sale, t)
	return t, nil
}

// soldOutErrors are the SOLD_OUT answers of the SKUs flagged gone, one error value per SKU,
// made at its first answer: once a flash sale's SKU is gone nearly every reserve of it gets
// this answer, and an error value says the same to every caller. Bounded: it starts over
// once it holds maxSoldOutErrors SKUs.
type soldOutErrors struct {
	mu sync.RWMutex
	m  map[poolKey]error
}

const maxSoldOutErrors = 4096

// of is the SOLD_OUT answer of pool k.
func (s *soldOutErrors) of(k poolKey) error {
	s.mu.RLock()
	err, ok := s.m[k]
	s.mu.RUnlock()
	if ok {
		return err
	}
	err = fmt.Errorf("sale %s: %s is sold out in every region: %w", k.sale, k.sku, ErrSoldOut)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxSoldOutErrors {
		s.m = map[poolKey]error{}
	}
	s.m[k] = err
	return err
}
