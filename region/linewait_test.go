package region_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/region"
)

// heldFeed is one LineChanges answer and how long the call took.
type heldFeed struct {
	f    region.LineFeed
	took time.Duration
	err  error
}

// holdLine calls d's LineChanges of testSale from f (its incarnation, version and tag), held
// up to wait, in the background.
func holdLine(e *env, d *region.Door, f region.LineFeed, wait time.Duration) <-chan heldFeed {
	out := make(chan heldFeed, 1)
	go func() {
		start := time.Now()
		g, err := d.LineChanges(e.ctx, testSale, f.Room, f.Version, 1000, f.Tag, wait)
		out <- heldFeed{f: g, took: time.Since(start), err: err}
	}()
	return out
}

// TestLineChangesHeldUntilTheLineChanges: a LineChanges call with a wait whose tag is the
// line's is held while nothing changes (to the wait's end), and answered within a few
// admitting ticks once a buyer enters or the sale is paused; a call whose tag is another's
// (or none) is answered at once; a wait over MaxLineWait is refused naming wait_ms.
func TestLineChangesHeldUntilTheLineChanges(t *testing.T) {
	s := newSlowBinds(t)
	s.open()
	e, d := newRoomEnv(t, s)
	admitted(t, e, d, "alice")
	f0, err := d.LineChanges(e.ctx, testSale, "", 0, 1000, 0, 0)
	if err != nil || !f0.Full || len(f0.Entries) != 1 || f0.Tag == 0 {
		t.Fatalf("first feed: %+v, %v; want the full line of alice, tagged", f0, err)
	}
	// nothing changes: held to the wait's end, then answered with nothing new
	if h := <-holdLine(e, d, f0, 300*time.Millisecond); h.err != nil || h.took < 290*time.Millisecond ||
		len(h.f.Entries) != 0 || h.f.Tag != f0.Tag {
		t.Fatalf("held call of an unchanged line: %+v after %s, %v; want nothing new after the 300ms wait", h.f, h.took, h.err)
	}
	// another tag (a gate or counter the caller has not seen): answered at once
	stale := f0
	stale.Tag++
	if h := <-holdLine(e, d, stale, 5*time.Second); h.err != nil || h.took > 2*time.Second || h.f.Tag != f0.Tag {
		t.Fatalf("call with another tag: %+v after %s, %v; want answered at once", h.f, h.took, h.err)
	}
	// a buyer enters: the held call is answered with them, long before the wait's end
	held := holdLine(e, d, f0, 8*time.Second)
	time.Sleep(100 * time.Millisecond)
	b, err := d.Enter(e.ctx, testSale, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	h := <-held
	if h.err != nil || h.took > 4*time.Second || !hasEntry(h.f, b.ID) || h.f.Tag == f0.Tag {
		t.Fatalf("held call when bob entered: %+v after %s, %v; want bob's entry before the 8s wait", h.f, h.took, h.err)
	}
	// the sale is paused (no change of the room): the held call is answered with the gate
	for deadline := time.Now().Add(10 * time.Second); b.State != admission.Admitted; time.Sleep(5 * time.Millisecond) {
		if b, err = d.GetAdmission(e.ctx, testSale, b.ID); err != nil || time.Now().After(deadline) {
			t.Fatalf("bob not admitted within 10 s: %+v, %v", b, err)
		}
	}
	f1 := waitSettled(t, e, d, h.f)
	held = holdLine(e, d, f1, 8*time.Second)
	time.Sleep(100 * time.Millisecond)
	e.pause(1, "", true, 1, "stop")
	if h := <-held; h.err != nil || h.took > 4*time.Second || h.f.Gate != region.GatePaused {
		t.Fatalf("held call when the sale was paused: %+v after %s, %v; want gate PAUSED before the 8s wait", h.f, h.took, h.err)
	}
	_, err = d.LineChanges(e.ctx, testSale, f1.Room, f1.Version, 1000, f1.Tag, region.MaxLineWait+time.Millisecond)
	if !errors.Is(err, apierr.ErrInvalid) || !strings.Contains(err.Error(), "wait_ms") {
		t.Fatalf("wait over MaxLineWait: %v; want INVALID naming wait_ms", err)
	}
}

// hasEntry reports whether f carries entry id.
func hasEntry(f region.LineFeed, id string) bool {
	for _, en := range f.Entries {
		if en.ID == id {
			return true
		}
	}
	return false
}

// waitSettled fetches the line from f until an answer brings nothing new (bob admitted and
// bound), 10 s at most, and returns the last.
func waitSettled(t *testing.T, e *env, d *region.Door, f region.LineFeed) region.LineFeed {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		g, err := d.LineChanges(e.ctx, testSale, f.Room, f.Version, 1000, f.Tag, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Entries) == 0 && g.Tag == f.Tag {
			return g
		}
		f = g
	}
	t.Fatalf("the line did not settle within 10 s: %+v", f)
	return f
}
