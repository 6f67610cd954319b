package local_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/linearize"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// regionClient calls one region at whichever of its two processes leads, following NOT_LEADER
// answers that name the leader and trying the other process when one does not answer.
type regionClient struct {
	mu    sync.Mutex
	addrs []string
	cur   string
	conns map[string]*grpc.ClientConn
	creds credentials.TransportCredentials
}

func newRegionClient(creds credentials.TransportCredentials, addrs ...string) *regionClient {
	return &regionClient{addrs: addrs, cur: addrs[0], conns: map[string]*grpc.ClientConn{}, creds: creds}
}

func (rc *regionClient) client(addr string) (quotav1.RegionServiceClient, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	conn, ok := rc.conns[addr]
	if !ok {
		var err error
		if conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(rc.creds)); err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		rc.conns[addr] = conn
	}
	return quotav1.NewRegionServiceClient(conn), nil
}

func (rc *regionClient) close() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, c := range rc.conns {
		c.Close()
	}
}

// retryable: the outcome is unknown or the process does not lead; ask again (same key).
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal, codes.Aborted:
		return true
	}
	return apierr.Reason(err) == "UNKNOWN_OUTCOME" || apierr.Reason(err) == "NOT_LEADER"
}

// call runs f at the leader until it gives an answer that is not retryable or within runs
// out; the error is then the last retryable one.
func (rc *regionClient) call(ctx context.Context, within time.Duration, f func(context.Context, quotav1.RegionServiceClient) error) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		rc.mu.Lock()
		addr := rc.cur
		rc.mu.Unlock()
		cl, err := rc.client(addr)
		if err != nil {
			return err
		}
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		err = f(actx, cl)
		acancel()
		if err == nil || !retryable(err) {
			return err
		}
		rc.mu.Lock()
		if hint := apierr.LeaderHint(err); hint != "" && hint != addr {
			rc.cur = hint
		} else if rc.cur == addr {
			rc.cur = rc.addrs[0]
			if addr == rc.addrs[0] {
				rc.cur = rc.addrs[1]
			}
		}
		rc.mu.Unlock()
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// linWorker reserves, confirms and releases on the linearizability pool and records every
// operation; holds whose last operation had an unknown outcome are asked again (same key,
// hold and payment) before anything new.
type linWorker struct {
	id      int
	rc      *regionClient
	pool    *linPool // the episode's pool new operations go to
	sku     string
	rng     *mrand.Rand
	seq     int
	pending []linOp                      // operations to ask again, each on its own pool
	expect  map[string]quotav1.HoldState // hold → its state as acknowledged
	counts  map[linearize.Kind]int
}

// linOp is an operation and the pool it belongs to.
type linOp struct {
	in   linearize.Input
	pool *linPool
}

func (w *linWorker) do(ctx context.Context, lo linOp) linearize.Output {
	in := lo.in
	op := lo.pool.rec.Begin(w.id, in)
	w.counts[in.Kind]++
	var out linearize.Output
	err := w.rc.call(ctx, 6*time.Second, func(ctx context.Context, cl quotav1.RegionServiceClient) error {
		var err error
		out, err = w.once(ctx, cl, lo.pool.sale, in)
		return err
	})
	if err != nil {
		out = classify(in.Kind, err)
	}
	op.End(out)
	switch {
	case out.Result == linearize.Unknown:
		w.pending = append(w.pending, lo)
		if in.Kind != linearize.Reserve {
			w.expect[in.Hold] = quotav1.HoldState_HOLD_STATE_UNSPECIFIED // it must exist; its state is open
		}
	case out.Result == linearize.Held:
		w.expect[out.Hold] = quotav1.HoldState_HOLD_STATE_HELD
	case out.Result == linearize.Sold:
		w.expect[in.Hold] = quotav1.HoldState_HOLD_STATE_SOLD
	case out.Result == linearize.Released:
		w.expect[in.Hold] = quotav1.HoldState_HOLD_STATE_RELEASED
	}
	return out
}

func (w *linWorker) once(ctx context.Context, cl quotav1.RegionServiceClient, sale string, in linearize.Input) (linearize.Output, error) {
	switch in.Kind {
	case linearize.Reserve:
		r, err := cl.Reserve(ctx, &quotav1.ReserveRequest{SaleId: sale, Sku: w.sku, UserId: in.User, Quantity: in.Qty, RequestKey: in.Key})
		return linearize.Output{Result: linearize.Held, Hold: r.GetReservation().GetHoldId()}, err
	case linearize.Confirm:
		r, err := cl.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: in.Hold, PaymentId: in.Payment})
		if r.GetOutcome() == quotav1.ConfirmOutcome_CONFIRM_OUTCOME_REFUND {
			return linearize.Output{Result: linearize.Refund}, err
		}
		return linearize.Output{Result: linearize.Sold}, err
	}
	_, err := cl.Release(ctx, &quotav1.ReleaseRequest{HoldId: in.Hold})
	return linearize.Output{Result: linearize.Released}, err
}

// classify maps a definite error to a result; anything else is Unknown.
func classify(kind linearize.Kind, err error) linearize.Output {
	switch r := apierr.Reason(err); {
	case kind == linearize.Reserve && (r == "REGION_EXHAUSTED" || r == "SOLD_OUT"):
		return linearize.Output{Result: linearize.Empty}
	case kind == linearize.Reserve && r == "LIMIT_EXCEEDED":
		return linearize.Output{Result: linearize.Limit}
	case kind == linearize.Release && r == "CONFLICT":
		return linearize.Output{Result: linearize.Conflict}
	case r == "NOT_FOUND" && kind != linearize.Reserve:
		return linearize.Output{Result: linearize.NotFound}
	}
	return linearize.Output{Result: linearize.Unknown}
}

// step asks again what was unknown, else starts a new checkout: reserve one unit, then pay
// (5%) or release (95%), and now and then pay after the release (it must be refunded).
func (w *linWorker) step(ctx context.Context) {
	if len(w.pending) > 0 {
		lo := w.pending[0]
		w.pending = w.pending[1:]
		if out := w.do(ctx, lo); out.Result == linearize.Held {
			w.finish(ctx, lo.pool, out.Hold)
		}
		return
	}
	w.seq++
	in := linearize.Input{Kind: linearize.Reserve, User: fmt.Sprintf("lin-%d-%d", w.id, w.rng.IntN(100)),
		Key: fmt.Sprintf("k-%d-%d", w.id, w.seq), Qty: 1}
	pool := w.pool
	if out := w.do(ctx, linOp{in, pool}); out.Result == linearize.Held {
		w.finish(ctx, pool, out.Hold)
	}
}

func (w *linWorker) finish(ctx context.Context, pool *linPool, hold string) {
	pay := linOp{linearize.Input{Kind: linearize.Confirm, Hold: hold, Payment: "pay-" + hold}, pool}
	if w.rng.IntN(100) < 5 {
		w.do(ctx, pay)
		return
	}
	out := w.do(ctx, linOp{linearize.Input{Kind: linearize.Release, Hold: hold}, pool})
	if out.Result == linearize.Released && w.rng.IntN(100) < 10 {
		w.do(ctx, pay)
	}
}

// drain asks again every unknown operation until each has an answer or ctx ends.
func (w *linWorker) drain(ctx context.Context) {
	for len(w.pending) > 0 && ctx.Err() == nil {
		w.step(ctx)
	}
}

// checkHolds compares every hold the worker was answered about with the region's record.
func (w *linWorker) checkHolds(ctx context.Context) (checked int, bad []string) {
	for id, want := range w.expect {
		var got *quotav1.Reservation
		err := w.rc.call(ctx, 10*time.Second, func(ctx context.Context, cl quotav1.RegionServiceClient) error {
			r, err := cl.GetReservation(ctx, &quotav1.GetReservationRequest{HoldId: id})
			got = r.GetReservation()
			return err
		})
		checked++
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("lin hold %s: %v", id, err))
		case want != quotav1.HoldState_HOLD_STATE_UNSPECIFIED && got.GetState() != want:
			bad = append(bad, fmt.Sprintf("lin hold %s: %s, acknowledged %s", id, got.GetState(), want))
		}
	}
	return checked, bad
}
