package transfer

import (
	"fmt"
	"sort"
)

// Weight is one region's share in an allocation.
type Weight struct {
	Region string
	Weight int64
}

// Split divides total over weights by the largest-remainder method: each region gets the
// floor of its exact share, and the units left over go one each to the largest remainders
// (ties to the earlier region in the list). The parts always sum to total.
func Split(total Units, weights []Weight) ([]Units, error) {
	if total < 0 {
		return nil, fmt.Errorf("split: negative total %d", total)
	}
	var sum int64
	for _, w := range weights {
		if w.Weight < 0 {
			return nil, fmt.Errorf("split: region %s has negative weight %d", w.Region, w.Weight)
		}
		sum += w.Weight
	}
	if sum == 0 {
		return nil, fmt.Errorf("split: weights sum to zero")
	}
	parts := make([]Units, len(weights))
	rems := make([]int64, len(weights))
	var given Units
	for i, w := range weights {
		exact := int64(total) * w.Weight // total ≤ MaxUnits and weights are small: no overflow
		parts[i] = Units(exact / sum)
		rems[i] = exact % sum
		given += parts[i]
	}
	order := make([]int, len(weights))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return rems[order[a]] > rems[order[b]] })
	for k := 0; given < total; k++ {
		parts[order[k%len(order)]]++
		given++
	}
	return parts, nil
}
