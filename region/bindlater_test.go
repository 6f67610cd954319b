package region_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// slowBinds is an etcdBinds whose binds wait at a gate (closed until open is called) and
// fail while failing is set: an etcd across an ocean, and one that cannot be reached.
type slowBinds struct {
	*etcdBinds
	gate    chan struct{}
	failing atomic.Bool
}

func newSlowBinds(t *testing.T) *slowBinds {
	return &slowBinds{etcdBinds: newEtcdBinds(t), gate: make(chan struct{})}
}

func (s *slowBinds) open() { close(s.gate) }

func (s *slowBinds) bind(ctx context.Context, sale, user, region string) (string, error) {
	if s.failing.Load() {
		return "", errors.New("etcd unreachable")
	}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return s.binder.Load().Bind(ctx, sale, user, region)
}

// roomEnv is region us binding through s, with a front door and a sale with a waiting room
// of 10 units, 2 a buyer.
func newRoomEnv(t *testing.T, s *slowBinds) (*env, *region.Door) {
	t.Helper()
	keys, err := admission.ParseKeyring([]byte("k1 " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *region.Config) {
		c.Cluster.Tickets = func() *admission.Keyring { return keys }
		c.Binding.Bind = s.bind
	})
	d, err := region.NewDoor(e.r, region.DoorConfig{Keys: func() *admission.Keyring { return keys }, Bind: s.bind, PerUserRate: 1000, PerUserBurst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	terms := defaultTerms(testSale, 2)
	terms.Admission = transfer.AdmissionTerms{Rate: 1000, TicketTTL: time.Hour, MaxLive: 10}
	e.sale(terms, 10)
	return e, d
}

// admitted enters user and polls until the room admits them (10 s at most), returning the
// admission with its ticket.
func admitted(t *testing.T, e *env, d *region.Door, user string) region.Admission {
	t.Helper()
	a, err := d.Enter(e.ctx, testSale, user, "")
	if err != nil {
		t.Fatalf("enter %s: %v", user, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.State != admission.Admitted {
		if time.Now().After(deadline) {
			t.Fatalf("%s not admitted within 10 s: %+v", user, a)
		}
		time.Sleep(5 * time.Millisecond)
		if a, err = d.GetAdmission(e.ctx, testSale, a.ID); err != nil {
			t.Fatalf("poll %s: %v", user, err)
		}
	}
	return a
}

func ticketed(e *env, d *region.Door, a region.Admission, key string, q transfer.Units) (region.ReserveResult, error) {
	return d.Reserve(e.ctx, region.ReserveRequest{Sale: testSale, SKU: testSKU, User: a.User, Quantity: q, RequestKey: key, Ticket: a.Ticket})
}

// TestAdmissionDoesNotWaitForTheBinding: a waiting room admits a buyer, and the ticket
// reserves, while the buyer's binding is still on its way to etcd (an ocean away); the sale
// (Confirm) is what waits for it, and happens once the buyer is bound here.
func TestAdmissionDoesNotWaitForTheBinding(t *testing.T) {
	s := newSlowBinds(t)
	e, d := newRoomEnv(t, s)
	a := admitted(t, e, d, "alice")
	if got := s.bound(t, "alice"); got != "" {
		t.Fatalf("alice bound to %q before the gate opened", got)
	}
	res, err := ticketed(e, d, a, "k1", 2)
	if err != nil {
		t.Fatalf("reserve with the ticket while the binding is on its way: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		c, err := e.r.Confirm(e.ctx, res.Hold.ID, "pay-1")
		if err == nil && !c.Sold {
			err = errors.New("not sold: " + c.Reason)
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the confirm did not wait for the binding: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	s.open()
	if err := <-done; err != nil {
		t.Fatalf("confirm once bound: %v", err)
	}
	if got := s.bound(t, "alice"); got != "us" {
		t.Fatalf("alice bound to %q in etcd; want us", got)
	}
	e.checkPool(testSale, testSKU, counts{8, 0, 2})
}

// TestAdmissionWithdrawnWhenBoundElsewhere: two buyers already bound to eu are admitted at
// us before us's bindings answer; erin holds 2 units on her ticket (which uses it), bob does
// not reserve. When the bindings answer eu, bob's admission ends Elsewhere naming eu and his
// ticket reserves nothing, erin's holds are given back, and nothing of either is sold here.
func TestAdmissionWithdrawnWhenBoundElsewhere(t *testing.T) {
	s := newSlowBinds(t)
	for _, user := range []string{"bob", "erin"} {
		if got, err := s.binder.Load().Bind(context.Background(), testSale, user, "eu"); err != nil || got != "eu" {
			t.Fatalf("bind %s to eu: %q, %v", user, got, err)
		}
	}
	e, d := newRoomEnv(t, s)
	bob, erin := admitted(t, e, d, "bob"), admitted(t, e, d, "erin")
	res, err := ticketed(e, d, erin, "k1", 2)
	if err != nil {
		t.Fatalf("reserve with the ticket while the binding is on its way: %v", err)
	}
	e.checkPool(testSale, testSKU, counts{8, 2, 0})
	s.open()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := d.GetAdmission(e.ctx, testSale, bob.ID)
		if got.State == admission.Elsewhere {
			if !boundTo(err, "eu") {
				t.Fatalf("withdrawn admission answers %v; want BOUND_ELSEWHERE naming eu", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admission was not withdrawn within 10 s: %+v, %v", got, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitPool(t, e, counts{10, 0, 0})
	if _, err := ticketed(e, d, bob, "k1", 1); !boundTo(err, "eu") {
		t.Fatalf("the withdrawn ticket reserves: %v; want BOUND_ELSEWHERE naming eu", err)
	}
	if c, err := e.r.Confirm(e.ctx, res.Hold.ID, "pay-1"); err != nil || c.Sold {
		t.Fatalf("confirm of the released hold: %+v, %v; want not sold", c, err)
	}
	e.checkPool(testSale, testSKU, counts{10, 0, 0})
}

// TestConfirmBindsWhenTheAdmissionCouldNot: the binding after the admission fails (etcd
// unreachable), so the region never learnt where the buyer is bound; the confirm binds them,
// finds eu, refuses BOUND_ELSEWHERE naming eu and gives the hold back. A buyer bound nowhere
// is bound here by their confirm, and sold.
func TestConfirmBindsWhenTheAdmissionCouldNot(t *testing.T) {
	s := newSlowBinds(t)
	s.open()
	if got, err := s.binder.Load().Bind(context.Background(), testSale, "carol", "eu"); err != nil || got != "eu" {
		t.Fatalf("bind carol to eu: %q, %v", got, err)
	}
	e, d := newRoomEnv(t, s)
	s.failing.Store(true)
	carol, dave := admitted(t, e, d, "carol"), admitted(t, e, d, "dave")
	rc, err := ticketed(e, d, carol, "k1", 1)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := ticketed(e, d, dave, "k1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.Confirm(e.ctx, rc.Hold.ID, "pay-c"); !errors.Is(err, apierr.ErrAborted) {
		t.Fatalf("confirm while etcd is unreachable: %v; want ABORTED", err)
	}
	s.failing.Store(false)
	if _, err := e.r.Confirm(e.ctx, rc.Hold.ID, "pay-c"); !boundTo(err, "eu") {
		t.Fatalf("confirm of a buyer bound to eu: %v; want BOUND_ELSEWHERE naming eu", err)
	}
	if c, err := e.r.Confirm(e.ctx, rd.Hold.ID, "pay-d"); err != nil || !c.Sold {
		t.Fatalf("confirm of a buyer bound nowhere: %+v, %v; want sold", c, err)
	}
	if got := s.bound(t, "dave"); got != "us" {
		t.Fatalf("dave bound to %q; want us", got)
	}
	e.checkPool(testSale, testSKU, counts{9, 0, 1})
}

// waitPool waits up to 10 s for the pool's counters to be want.
func waitPool(t *testing.T, e *env, want counts) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p := stock(t, e.r, testSale, testSKU)
		got := counts{p.Available, p.Held, p.Sold}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s; want %s", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
