package coordinator

import (
	"fmt"
	"slices"
	"testing"
)

// A change feed reads every sale until every source listens and at once after a source
// (re)starts listening; then only the sales told, each once, in order; what a round could not
// read comes back; past maxChangedSales it reads every sale instead of growing.
func TestChangeFeed(t *testing.T) {
	var woken []string
	f := newChangeFeed(2, func(s string) { woken = append(woken, s) })
	if all, _ := f.take(); !all || f.live() {
		t.Fatal("a feed none of whose sources listens does not read every sale")
	}
	f.listening()
	f.saleChanged("a")
	if all, _ := f.take(); !all {
		t.Fatal("a feed with a source not listening does not read every sale")
	}
	f.listening()
	if all, _ := f.take(); !all || !f.live() {
		t.Fatal("the round after a source starts listening does not read every sale")
	}
	if all, sales := f.take(); all || len(sales) != 0 {
		t.Fatalf("an idle feed reads all=%v %v, want nothing", all, sales)
	}
	for _, s := range []string{"b", "a", "b"} {
		f.saleChanged(s)
	}
	if all, sales := f.take(); all || !slices.Equal(sales, []string{"a", "b"}) {
		t.Fatalf("take = %v %v, want a, b", all, sales)
	}
	if !slices.Equal(woken, []string{"a", "b", "a", "b"}) {
		t.Fatalf("woke %v, want every change told", woken)
	}
	f.putBack(false, []string{"c"})
	f.again("d")
	if all, sales := f.take(); all || !slices.Equal(sales, []string{"c", "d"}) {
		t.Fatalf("take = %v %v, want c, d back", all, sales)
	}
	f.putBack(true, nil)
	if all, _ := f.take(); !all {
		t.Fatal("a round that read nothing of every sale does not come back as every sale")
	}
	f.stopped()
	if all, _ := f.take(); !all || f.live() {
		t.Fatal("a feed whose source stopped does not read every sale")
	}
	f.listening()
	f.take()
	for i := range maxChangedSales + 1 {
		f.again(fmt.Sprint(i))
	}
	if all, sales := f.take(); !all || len(f.changed) != 0 || sales != nil {
		t.Fatal("past maxChangedSales the feed does not read every sale")
	}
}
