package admission

import (
	"fmt"
)

// entryLine is a line of Queued entries with O(1) positions: entries leave only from the
// front (picked, or all at once when closed) and join at either end, so their seq numbers
// are consecutive from head's and an entry's position is its seq less head's, plus one.
type entryLine struct {
	q    entryDeque
	head int64 // seq of the front entry
}

func (l *entryLine) len() int { return l.q.len() }

func (l *entryLine) position(e *lineEntry) int { return int(e.seq-l.head) + 1 }

func (l *entryLine) pushBack(e *lineEntry) {
	e.seq = l.head + int64(l.q.len())
	l.q.pushBack(e)
}

func (l *entryLine) pushFront(e *lineEntry) {
	l.head--
	e.seq = l.head
	l.q.pushFront(e)
}

func (l *entryLine) popFront() *lineEntry {
	l.head++
	return l.q.popFront()
}

// remove takes e, which is in the line, out of it wherever it stands: the entries ahead of
// it move back one slot each, keeping their positions, and those behind it move up one.
// It takes time in e's position.
func (l *entryLine) remove(e *lineEntry) {
	i := int(e.seq - l.head)
	if i < 0 || i >= l.q.len() || l.q.at(i) != e {
		panic(fmt.Sprintf("admission: entry %s is not in the line", e.id))
	}
	for ; i > 0; i-- {
		p := l.q.at(i - 1)
		p.seq++
		l.q.set(i, p)
	}
	l.popFront()
}

func (l *entryLine) clear() { l.q = entryDeque{} }

// entryDeque is a ring buffer of entries.
type entryDeque struct {
	buf   []*lineEntry
	first int
	n     int
}

func (d *entryDeque) len() int { return d.n }

func (d *entryDeque) front() *lineEntry {
	if d.n == 0 {
		panic("admission: front of an empty deque")
	}
	return d.buf[d.first]
}

// at returns the i-th entry from the front.
func (d *entryDeque) at(i int) *lineEntry { return d.buf[(d.first+i)%len(d.buf)] }

// set puts e at the i-th place from the front.
func (d *entryDeque) set(i int, e *lineEntry) { d.buf[(d.first+i)%len(d.buf)] = e }

func (d *entryDeque) grow() {
	if d.n < len(d.buf) {
		return
	}
	buf := make([]*lineEntry, max(8, 2*len(d.buf)))
	for i := range d.n {
		buf[i] = d.buf[(d.first+i)%len(d.buf)]
	}
	d.buf, d.first = buf, 0
}

func (d *entryDeque) pushBack(e *lineEntry) {
	d.grow()
	d.buf[(d.first+d.n)%len(d.buf)] = e
	d.n++
}

func (d *entryDeque) pushFront(e *lineEntry) {
	d.grow()
	d.first = (d.first + len(d.buf) - 1) % len(d.buf)
	d.buf[d.first] = e
	d.n++
}

func (d *entryDeque) popFront() *lineEntry {
	e := d.front()
	d.buf[d.first] = nil
	d.first = (d.first + 1) % len(d.buf)
	d.n--
	if d.n == 0 {
		d.first = 0
	}
	if len(d.buf) > 64 && d.n < len(d.buf)/4 { // give memory back after a rush
		buf := make([]*lineEntry, len(d.buf)/2)
		for i := range d.n {
			buf[i] = d.buf[(d.first+i)%len(d.buf)]
		}
		d.buf, d.first = buf, 0
	}
	return e
}

// entryExpiries is a min-heap (container/heap) of the Admitted entries by expiry.
type entryExpiries []*lineEntry

// Len is heap.Interface's.
func (h entryExpiries) Len() int { return len(h) }

// Less orders by expiry.
func (h entryExpiries) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }

// Swap keeps each entry's heapIdx.
func (h entryExpiries) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}

// Push adds an *lineEntry.
func (h *entryExpiries) Push(x any) {
	e := x.(*lineEntry)
	e.heapIdx = len(*h)
	*h = append(*h, e)
}

// Pop removes the last entry.
func (h *entryExpiries) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
