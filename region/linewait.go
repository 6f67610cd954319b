package region

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// A storefront edge fetches each sale's line every refresh (docs/storefront.md, "Edges"), and
// most fetches find nothing new. What such a call costs the leader is not its answer but the
// wake-up of the process it makes (the network poller, the scheduler's threads, TLS and
// HTTP/2 framing): about half a millisecond of CPU each, per edge, four times a second. So a
// call may ask to be held (a long poll: LineChanges' wait) while its answer would bring
// nothing new, that is while the line's tag (feedTag) is still the one the edge has; the door's
// admitting tick, which runs anyway, checks the tags of the sales with held calls and lets go
// of those whose line changed in the same wake-up. An edge's fetches then follow the line's
// changes, at most one per refresh, and a change reaches it within a tick instead of up to a
// refresh later.

// MaxLineWait bounds how long a LineChanges call is held.
const MaxLineWait = 10 * time.Second

// maxLineWaits bounds the calls held at once; past it a call is answered at once.
const maxLineWaits = 4096

// feedTag identifies what f brings a copy of the line besides its entries: the incarnation,
// the version, the line's counters, the gate and the region (LineFeed.Tag). Never 0 (a first
// call's tag).
func feedTag(f LineFeed) uint64 {
	b := make([]byte, 0, 128)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	flag := func(v bool) {
		if v {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	str(f.Room)
	str(f.Reason)
	str(f.Gate)
	str(f.Region)
	flag(f.Opened)
	flag(f.Closed)
	b = binary.AppendUvarint(b, f.Version)
	b = binary.AppendVarint(b, f.OpensAt.Unix())
	b = binary.AppendVarint(b, int64(f.OpensAt.Nanosecond()))
	b = binary.AppendVarint(b, f.Head)
	b = binary.AppendVarint(b, int64(f.Binding))
	b = binary.AppendUvarint(b, math.Float64bits(f.FlowRate))
	h := fnv.New64a()
	h.Write(b)
	return max(h.Sum64(), 1)
}

// lineReads are the door's answers about its lines that change nothing: the polls of
// admissions, counted for Door.Polls, and LineChanges' answers, with the calls held, by sale.
type lineReads struct {
	d      *Door
	polls  atomic.Uint64
	mu     sync.Mutex
	n      int
	bySale map[string]map[*lineWait]struct{}
}

// changes is Door.LineChanges once its arguments are checked.
func (l *lineReads) changes(ctx context.Context, sale, room string, since uint64, limit int, tag uint64, wait time.Duration) (LineFeed, error) {
	f, err := l.feed(ctx, sale, room, since, limit)
	if err != nil || wait == 0 || tag == 0 || f.Tag != tag || f.Full || f.More || len(f.Entries) > 0 {
		return f, err
	}
	w := l.add(sale, tag)
	if w == nil {
		return f, nil
	}
	defer l.remove(sale, w)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.ch:
	case <-t.C:
	case <-ctx.Done():
		return f, nil // the caller is gone, or its deadline came: the answer it would have had
	case <-l.d.done:
		return f, nil
	}
	return l.feed(ctx, sale, room, since, limit)
}

// feed is LineChanges' answer as of now.
func (l *lineReads) feed(ctx context.Context, sale, room string, since uint64, limit int) (LineFeed, error) {
	d := l.d
	sr, t, err := d.room(ctx, sale)
	if err != nil {
		return LineFeed{}, err
	}
	out := LineFeed{Feed: sr.room.Changes(room, since, limit, d.r.cfg.Clock.Now()), Region: d.r.cfg.Name, Gate: d.gates.line(t)}
	out.Tag = feedTag(out)
	return out, nil
}

// releaseChanged lets go of the held calls whose sale's line changed (every one of a sale
// whose room or terms are gone): the admitting tick's last step.
func (l *lineReads) releaseChanged(ctx context.Context) {
	d := l.d
	for _, sale := range l.sales() {
		d.mu.Lock()
		sr := d.rooms[sale]
		d.mu.Unlock()
		t, err := d.r.terms(ctx, sale)
		if sr == nil || err != nil {
			l.release(sale, 0, false)
			continue
		}
		f := LineFeed{Feed: sr.room.Counters(d.r.cfg.Clock.Now()), Region: d.r.cfg.Name, Gate: d.gates.line(t)}
		l.release(sale, feedTag(f), true)
	}
}

// lineWait is one held call: the tag its answer would have now, and a channel closed when
// the line's tag is another.
type lineWait struct {
	tag uint64
	ch  chan struct{}
}

// add holds a call of sale's line at tag; nil when maxLineWaits are held.
func (l *lineReads) add(sale string, tag uint64) *lineWait {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= maxLineWaits {
		return nil
	}
	if l.bySale == nil {
		l.bySale = map[string]map[*lineWait]struct{}{}
	}
	if l.bySale[sale] == nil {
		l.bySale[sale] = map[*lineWait]struct{}{}
	}
	w := &lineWait{tag: tag, ch: make(chan struct{})}
	l.bySale[sale][w] = struct{}{}
	l.n++
	return w
}

// remove forgets w (let go or not).
func (l *lineReads) remove(sale string, w *lineWait) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.bySale[sale][w]; ok {
		l.drop(sale, w)
	}
}

// drop forgets w, held; l.mu is held.
func (l *lineReads) drop(sale string, w *lineWait) {
	delete(l.bySale[sale], w)
	if len(l.bySale[sale]) == 0 {
		delete(l.bySale, sale)
	}
	l.n--
}

// sales are the sales with calls held.
func (l *lineReads) sales() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.bySale))
	for s := range l.bySale {
		out = append(out, s)
	}
	return out
}

// release lets go of sale's calls held at another tag than tag (every one when !known).
func (l *lineReads) release(sale string, tag uint64, known bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.bySale[sale] {
		if !known || w.tag != tag {
			close(w.ch)
			l.drop(sale, w)
		}
	}
}

// releaseAll lets go of every call held.
func (l *lineReads) releaseAll() {
	for _, s := range l.sales() {
		l.release(s, 0, false)
	}
}
