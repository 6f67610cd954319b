package region

import (
	"context"
	"strconv"
	"testing"
)

// TestBindingsAreBounded: the region remembers at most MaxBindings buyers' bindings, the
// most recently asked about kept; a buyer forgotten is asked about again.
func TestBindingsAreBounded(t *testing.T) {
	var calls int
	b := newBindings(Config{Name: "us", Binding: BindingConfig{MaxBindings: 4, InFlight: 1, Bind: func(_ context.Context, _, user, region string) (string, error) {
		calls++
		if user == "elsewhere" {
			return "eu", nil
		}
		return region, nil
	}}})
	ctx := context.Background()
	for i := range 10 {
		if got, err := b.of(ctx, saleUser{"s", "u" + strconv.Itoa(i)}); err != nil || got != "us" {
			t.Fatalf("u%d: %q, %v", i, got, err)
		}
		if n := len(b.cur) + len(b.old); n > 4 {
			t.Fatalf("%d bindings kept after %d buyers; want at most 4", n, i+1)
		}
	}
	if got, _ := b.of(ctx, saleUser{"s", "u9"}); got != "us" || calls != 10 {
		t.Fatalf("the last buyer again: %q after %d calls; want us from memory (10 calls)", got, calls)
	}
	if _, ok := b.cached(saleUser{"s", "u0"}); ok {
		t.Fatal("the first of 10 buyers is still kept with room for 4")
	}
	if got, _ := b.of(ctx, saleUser{"s", "u0"}); got != "us" || calls != 11 {
		t.Fatalf("a forgotten buyer: %q after %d calls; want us, asked again (11 calls)", got, calls)
	}
	if got, _ := b.of(ctx, saleUser{"s", "elsewhere"}); got != "eu" {
		t.Fatalf("a buyer bound elsewhere: %q", got)
	}
	if got, ok := b.cached(saleUser{"s", "elsewhere"}); !ok || got != "eu" || len(b.flight) != 0 {
		t.Fatalf("remembered %q, %v; %d bindings in flight", got, ok, len(b.flight))
	}
}
