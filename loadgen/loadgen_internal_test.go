package loadgen

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/quotaworks/quota/transfer"
)

// TestBuyersChooseBySeedAndNumberAlone: buyer n's region and hold outcome come from (seed, n)
// only, whatever order the workers take buyers in, so a run repeated with the same seed
// replays the same requests at the same regions. A source shared per worker failed this.
func TestBuyersChooseBySeedAndNumberAlone(t *testing.T) {
	regions := []Region{{Name: "us", Weight: 60}, {Name: "eu", Weight: 25}, {Name: "ap", Weight: 15}}
	choose := func(seed uint64, n int64) (int, float64) {
		rng := buyerRNG(seed, n)
		return pick(rng, regions, 100), rng.Float64()
	}
	first := map[int64][2]float64{}
	for n := int64(0); n < 500; n++ {
		r, x := choose(7, n)
		first[n] = [2]float64{float64(r), x}
	}
	seen := map[int]bool{}
	for n := int64(499); n >= 0; n-- { // the other order, as another schedule would take them
		r, x := choose(7, n)
		if got := [2]float64{float64(r), x}; got != first[n] {
			t.Fatalf("buyer %d: %v, then %v", n, first[n], got)
		}
		seen[r] = true
	}
	if len(seen) != len(regions) {
		t.Errorf("500 buyers reached %d of %d regions", len(seen), len(regions))
	}
}

// TestCartSettingsAreChecked: a cart's lines are refused, naming the "cart" setting and why,
// when they come with a SKU, repeat a SKU, lack one, ask no or too many units, exceed the
// lines a cart may have or go through the HTTP edges; a cart of two lines is accepted.
func TestCartSettingsAreChecked(t *testing.T) {
	ok := func() Config {
		return Config{Buyers: 1, Concurrency: 1, Cart: []CartLine{{"phone", 1}, {"case", 2}}}
	}
	if c := ok(); c.CheckSettings() != nil {
		t.Fatalf("a cart of phone=1,case=2: %v", c.CheckSettings())
	}
	many := make([]CartLine, MaxCartLines+1)
	for i := range many {
		many[i] = CartLine{fmt.Sprintf("sku%d", i), 1}
	}
	for name, tc := range map[string]struct {
		tune func(*Config)
		want string
	}{
		"with a sku":     {func(c *Config) { c.SKU = "phone" }, "in place of sku"},
		"sku twice":      {func(c *Config) { c.Cart[1].SKU = "phone" }, "sku phone given twice"},
		"no sku":         {func(c *Config) { c.Cart[0].SKU = "" }, "line 0 has no sku"},
		"no units":       {func(c *Config) { c.Cart[1].Quantity = 0 }, "sku case: quantity 0"},
		"too many":       {func(c *Config) { c.Cart[1].Quantity = transfer.MaxUnits + 1 }, "sku case: quantity"},
		"too many lines": {func(c *Config) { c.Cart = many }, "17 lines, more than the 16"},
		"over http":      {func(c *Config) { c.HTTP = &HTTPEdge{} }, "over gRPC"},
	} {
		c := ok()
		tc.tune(&c)
		var invalid *InvalidError
		if err := c.CheckSettings(); !errors.As(err, &invalid) || invalid.Field != "cart" || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an InvalidError of cart saying %q", name, err, tc.want)
		}
	}
}
