package region_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// TestNewLeaderFencesOldOne: A leads with epoch 1, B takes over with epoch 2 on the same
// database. A's next write fails (NOT_LEADER: its batch met the epoch fence) and writes nothing; A stops leading;
// B serves from the stored state, including what A committed before.
func TestNewLeaderFencesOldOne(t *testing.T) {
	e := newEnv(t)
	a := e.r
	e.sale(defaultTerms(testSale, 5), 10)
	ha := e.mustReserve("alice", "k1", 2)

	b := e.newRegion(2)
	before := snapshot(t, e)

	_, err := a.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "bob", Quantity: 1, RequestKey: "k"})
	if !errors.Is(err, region.ErrNotLeader) || errors.Is(err, region.ErrFenced) {
		t.Fatalf("old leader's reserve: %v, want ErrNotLeader (a client goes to the new leader), not ErrFenced", err)
	}
	_, err = a.Confirm(e.ctx, ha.ID, "pay")
	if !errors.Is(err, region.ErrNotLeader) || errors.Is(err, region.ErrFenced) {
		t.Fatalf("old leader's confirm: %v, want ErrNotLeader (a client goes to the new leader), not ErrFenced", err)
	}
	_, err = a.Credit(e.ctx, region.CreditRequest{Generation: 1, TransferID: "late", Sale: testSale, SKU: testSKU, Units: 5})
	if !errors.Is(err, region.ErrNotLeader) || errors.Is(err, region.ErrFenced) {
		t.Fatalf("old leader's credit: %v, want ErrNotLeader (a client goes to the new leader), not ErrFenced", err)
	}
	if after := snapshot(t, e); after != before {
		t.Errorf("the fenced leader changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// A steps down on its own once fenced.
	deadline := time.Now().Add(5 * time.Second)
	for a.Leading() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if a.Leading() {
		t.Fatal("the fenced leader still leads")
	}
	if _, err := a.Release(e.ctx, ha.ID); !errors.Is(err, region.ErrNotLeader) {
		t.Errorf("release on a stepped-down region: %v, want ErrNotLeader", err)
	}
	if _, err := a.SweepNow(e.ctx); !errors.Is(err, region.ErrNotLeader) {
		t.Errorf("sweep on a stepped-down region: %v, want ErrNotLeader", err)
	}
	// A cannot take the lead back with its old epoch.
	if err := a.Lead(e.ctx, 1); !errors.Is(err, region.ErrFenced) {
		t.Errorf("lead again with epoch 1: %v, want ErrFenced", err)
	}
	if a.Leading() {
		t.Error("a refused Lead left the region leading")
	}

	// B serves: it sees A's committed hold and the remaining stock.
	r := b
	hb, err := r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "bob", Quantity: 1, RequestKey: "k"})
	if err != nil {
		t.Fatalf("new leader's reserve: %v", err)
	}
	if res, err := r.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "alice", Quantity: 2, RequestKey: "k1"}); err != nil || !res.Replayed || res.Hold.ID != ha.ID {
		t.Errorf("new leader replaying A's request: %+v, %v", res, err)
	}
	if c, err := r.Confirm(e.ctx, ha.ID, "pay"); err != nil || !c.Sold {
		t.Errorf("new leader confirming A's hold: %+v, %v", c, err)
	}
	_ = hb
	e.r = b
	e.checkPool(testSale, testSKU, counts{7, 1, 2})
}

// TestNewLeaderFencesInFlightBatches: the old leader is busy reserving when the new one
// takes over. Every reserve the old leader acknowledged is stored, nothing it refused is,
// and it stops serving; the books balance.
func TestNewLeaderFencesInFlightBatches(t *testing.T) {
	const workers, most = 8, 200
	e := newEnv(t)
	a := e.r
	e.sale(defaultTerms(testSale, 10000), 10000)
	var mu sync.Mutex
	granted := map[string]bool{}
	refusedKeys := map[string]bool{}
	var acks atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range most {
				key := fmt.Sprintf("w%d-%d", w, i)
				res, err := a.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: "u", Quantity: 1, RequestKey: key})
				mu.Lock()
				switch {
				case err == nil:
					granted[res.Hold.ID] = true
					acks.Add(1)
				case errors.Is(err, region.ErrFenced), errors.Is(err, region.ErrNotLeader):
					refusedKeys[key] = true
				case errors.Is(err, region.ErrUnknownOutcome):
				default:
					t.Errorf("old leader's reserve: %v", err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	for acks.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	b := e.newRegion(2)
	wg.Wait()
	for id := range granted {
		if h, err := b.GetReservation(e.ctx, id); err != nil || h.State != region.Held {
			t.Errorf("acknowledged hold %s: %+v, %v", id, h, err)
		}
	}
	for key := range refusedKeys {
		if n := count(t, e.pool, `SELECT count(*) FROM holds WHERE request_key = $1`, key); n != 0 {
			t.Errorf("refused request %s was stored", key)
		}
	}
	stored := count(t, e.pool, `SELECT count(*) FROM holds`)
	if stored < len(granted) || len(granted) >= workers*most {
		t.Errorf("%d holds stored, %d acknowledged (of %d asked)", stored, len(granted), workers*most)
	}
	if len(refusedKeys) == 0 {
		t.Error("the old leader refused nothing after it was fenced")
	}
	e.r = b
	e.checkPool(testSale, testSKU, counts{10000 - transfer.Units(stored), transfer.Units(stored), 0})
	t.Logf("%d granted by the old leader, %d stored, %d refused", len(granted), stored, len(refusedKeys))
}

// TestCoordinatorGenerationFence: a credit or sale definition with a generation below the
// highest seen for the sale is ErrFenced and changes nothing; credits are once per transfer id.
func TestCoordinatorGenerationFence(t *testing.T) {
	e := newEnv(t)
	terms := defaultTerms(testSale, 5)
	if err := e.r.PutSale(e.ctx, 1, terms); err != nil {
		t.Fatal(err)
	}
	credit := func(gen int64, id string, units transfer.Units) (transfer.InState, error) {
		return e.r.Credit(e.ctx, region.CreditRequest{Generation: gen, TransferID: id, Sale: testSale, SKU: testSKU, Units: units})
	}
	if st, err := credit(2, "t1", 10); err != nil || st != transfer.InCredited {
		t.Fatalf("credit gen 2: %v, %v", st, err)
	}
	e.checkPool(testSale, testSKU, counts{10, 0, 0})
	before := snapshot(t, e)
	if _, err := credit(1, "t2", 5); !errors.Is(err, region.ErrFenced) {
		t.Errorf("credit gen 1 after gen 2: %v, want ErrFenced", err)
	}
	if _, err := credit(1, "t1", 10); !errors.Is(err, region.ErrFenced) {
		t.Errorf("replayed credit gen 1 after gen 2: %v, want ErrFenced", err)
	}
	if err := e.r.PutSale(e.ctx, 1, terms); !errors.Is(err, region.ErrFenced) {
		t.Errorf("put sale gen 1 after gen 2: %v, want ErrFenced", err)
	}
	if after := snapshot(t, e); after != before {
		t.Errorf("fenced requests changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Replays: the same transfer credits once.
	for range 3 {
		if st, err := credit(2, "t1", 10); err != nil || st != transfer.InCredited {
			t.Fatalf("replayed credit: %v, %v", st, err)
		}
	}
	if st, err := credit(3, "t1", 10); err != nil || st != transfer.InCredited { // a newer coordinator retrying
		t.Fatalf("replayed credit at gen 3: %v, %v", st, err)
	}
	e.checkPool(testSale, testSKU, counts{10, 0, 0})
	before = snapshot(t, e)
	if _, err := credit(3, "t1", 11); !errors.Is(err, region.ErrAlreadyExists) {
		t.Errorf("same transfer id, other units: %v, want ErrAlreadyExists", err)
	}
	if _, err := e.r.Credit(e.ctx, region.CreditRequest{Generation: 3, TransferID: "t1", Sale: testSale, SKU: "other", Units: 10}); !errors.Is(err, region.ErrNotFound) {
		t.Errorf("credit of an sku not in the sale: %v, want ErrNotFound", err)
	}
	if after := snapshot(t, e); after != before {
		t.Errorf("refused credits changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if st, err := credit(3, "t3", 5); err != nil || st != transfer.InCredited {
		t.Fatalf("second transfer: %v, %v", st, err)
	}
	e.checkPool(testSale, testSKU, counts{15, 0, 0})
	books, err := region.ReadBooks(e.ctx, e.pool, "us", testSale)
	if err != nil {
		t.Fatal(err)
	}
	if len(books.Inbound) != 2 || books.Inbound["t1"].Units != 10 || books.Inbound["t3"].State != transfer.InCredited {
		t.Errorf("inbound records %+v", books.Inbound)
	}

	// Terms never change once recorded.
	changed := terms
	changed.PerUserLimit = 7
	if err := e.r.PutSale(e.ctx, 3, changed); !errors.Is(err, region.ErrAlreadyExists) {
		t.Errorf("redefining a sale: %v, want ErrAlreadyExists", err)
	}
	if err := e.r.PutSale(e.ctx, 3, terms); err != nil {
		t.Errorf("re-putting the same terms: %v", err)
	}
	if _, err := e.reserve("u", "k", 6); fieldOf(err) != "quantity" {
		t.Errorf("the limit changed with the refused redefinition: %v", err)
	}
}

// TestStepDown: after StepDown every change is ErrNotLeader and a region can lead again
// with a newer epoch; Lead twice is an error.
func TestStepDown(t *testing.T) {
	e := newEnv(t)
	e.sale(defaultTerms(testSale, 5), 10)
	if err := e.r.Lead(e.ctx, 1); err == nil {
		t.Error("Lead while leading succeeded")
	}
	e.r.StepDown()
	e.r.StepDown() // idempotent
	if e.r.Leading() {
		t.Fatal("leading after StepDown")
	}
	if _, err := e.reserve("u", "k", 1); !errors.Is(err, region.ErrNotLeader) {
		t.Errorf("reserve after StepDown: %v, want ErrNotLeader", err)
	}
	if _, err := e.r.Credit(e.ctx, region.CreditRequest{Generation: 1, TransferID: "t9", Sale: testSale, SKU: testSKU, Units: 1}); !errors.Is(err, region.ErrNotLeader) {
		t.Errorf("credit after StepDown: %v, want ErrNotLeader", err)
	}
	// Reads still work without leadership.
	if p := stock(t, e.r, testSale, testSKU); p.Available != 10 {
		t.Errorf("stock after StepDown: %+v", p)
	}
	if err := e.r.Lead(e.ctx, 2); err != nil {
		t.Fatalf("lead again: %v", err)
	}
	e.mustReserve("u", "k", 1)
	e.checkPool(testSale, testSKU, counts{9, 1, 0})
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []region.Config{
		{Name: ""},
		{Name: "US"},
		{Name: "unallocated"},
		{Name: "us", Writer: region.WriterConfig{MaxBatch: -1}},
		{Name: "us", Writer: region.WriterConfig{MaxBatch: 10001}},
		{Name: "us", Writer: region.WriterConfig{BatchWindow: -time.Millisecond}},
		{Name: "us", Writer: region.WriterConfig{BatchWindow: 2 * time.Second}},
		{Name: "us", Sweep: region.SweepConfig{Interval: time.Microsecond}},
		{Name: "us", Sweep: region.SweepConfig{Batch: -1}},
	} {
		if _, err := region.New(c, nil); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	c := region.Config{Name: "eu-west"}
	if err := c.Validate(); err != nil || c.Writer.MaxBatch != 256 || c.Sweep.Interval != time.Second || c.Sweep.Batch != 512 || c.Clock == nil || c.Logger == nil {
		t.Errorf("defaults: %+v, %v", c, err)
	}
}

// TestEpochFenceRuleIsOne: the writer's epoch fence is one rule, transfer.CurrentEpoch (the
// rule the simulation's store applies): its two SQL forms, fencing.CheckEpoch in a
// transaction and quota_check_epoch first in a batch sent in one round trip, admit exactly
// the epochs the rule admits, and refuse the others as fenced.
func TestEpochFenceRuleIsOne(t *testing.T) {
	e := newEnv(t)
	e.r.Close()
	const recorded = 3
	if err := pgutil.Tx(e.ctx, e.pool, func(tx pgx.Tx) error { return fencing.RaiseEpoch(e.ctx, tx, recorded) }); err != nil {
		t.Fatalf("raise the epoch to %d: %v", recorded, err)
	}
	for _, epoch := range []int64{0, 1, 2, 3, 4, 9} {
		rule := transfer.CurrentEpoch(recorded, epoch)
		tx, err := e.pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		checked := fencing.CheckEpoch(e.ctx, tx, epoch)
		if err := tx.Rollback(e.ctx); err != nil {
			t.Fatal(err)
		}
		b := &pgx.Batch{}
		fencing.QueueEpochCheck(b, epoch)
		sent := e.pool.SendBatch(e.ctx, b).Close()
		switch {
		case (checked == nil) != (rule == nil):
			t.Errorf("epoch %d, recorded %d: CheckEpoch %v, the rule %v", epoch, recorded, checked, rule)
		case checked != nil && !(errors.Is(checked, fencing.ErrFenced) && errors.Is(checked, transfer.ErrStaleEpoch)):
			t.Errorf("epoch %d: CheckEpoch %v, want ErrFenced and ErrStaleEpoch", epoch, checked)
		}
		if fenced := fencing.AsFenced(sent); (fenced != nil) != (rule != nil) || (fenced == nil && sent != nil) {
			t.Errorf("epoch %d, recorded %d: quota_check_epoch %v, the rule %v", epoch, recorded, sent, rule)
		}
	}
}
