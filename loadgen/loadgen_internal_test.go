package loadgen

import "testing"

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
