package sim

import (
	"fmt"
	"slices"

	"github.com/quotaworks/quota/transfer"
)

// Shape names: the three regions the suites run, and the national shape of docs/scaling.md.
const (
	ShapeDefault  = "default"
	ShapeNational = "national"
)

// shape is what one run simulates: the regions, the sale's SKUs, how each SKU's units are
// first allocated over the regions, which SKUs the traffic favours, and how often the whole
// state is judged.
type shape struct {
	name    string
	regions []string
	skus    []string
	// weights split each SKU's units over the regions at setup, as `sale create --allocate`.
	weights []transfer.Weight
	// hot is how many of the first SKUs draw half of the storefronts' and the operator's
	// picks (a flash sale's few wanted SKUs); 0: every SKU is drawn with the same odds.
	hot int
	// fullEvery is how many steps may pass between two checks of every SKU; the checks in
	// between judge only the SKUs whose durable state changed (1: every check is whole).
	fullEvery int
}

// defaultShape is the three regions and two SKUs every seed has run since the first.
var defaultShape = shape{
	name:    ShapeDefault,
	regions: []string{"us", "eu", "ap"},
	skus:    []string{"phone", "case"},
	weights: []transfer.Weight{{Region: "us", Weight: 40}, {Region: "eu", Weight: 35}, {Region: "ap", Weight: 25}},
	// Every step's check is whole, as it always was: its cost is a few pools.
	fullEvery: 1,
}

// Sizes of the national shape: a dozen regions and 250 SKUs, 3,000 pools (docs/scaling.md,
// "The national sale", at a twentieth of its 5,000 SKUs).
const (
	nationalRegions = 12
	nationalSKUs    = 250
	nationalHot     = 10
	nationalFull    = 250
)

// nationalWeights are the national regions' shares: the busiest about three times the
// smallest, as a capital's region (docs/scaling.md).
var nationalWeights = []int64{15, 12, 11, 10, 9, 8, 8, 7, 6, 5, 5, 4}

// nationalShape builds the national shape: regions r01..r12, SKUs s000..s249.
func nationalShape() shape {
	s := shape{name: ShapeNational, hot: nationalHot, fullEvery: nationalFull}
	for i := range nationalRegions {
		name := fmt.Sprintf("r%02d", i+1)
		s.regions = append(s.regions, name)
		s.weights = append(s.weights, transfer.Weight{Region: name, Weight: nationalWeights[i]})
	}
	for i := range nationalSKUs {
		s.skus = append(s.skus, fmt.Sprintf("s%03d", i))
	}
	return s
}

// shapeOf is the shape of that name.
func shapeOf(name string) (shape, error) {
	switch name {
	case "", ShapeDefault:
		return defaultShape, nil
	case ShapeNational:
		return nationalShape(), nil
	}
	return shape{}, fmt.Errorf("shape: want %q or %q, got %q", ShapeDefault, ShapeNational, name)
}

// pools is the regions and SKUs' pools, the unit of the national shape's size.
func (s shape) pools() int { return len(s.regions) * len(s.skus) }

// describe is the shape in a line of figures.
func (s shape) describe() string {
	return fmt.Sprintf("%s: %d regions × %d SKUs = %d pools (%d hot SKUs draw half the traffic; every SKU judged at least every %d steps)",
		s.name, len(s.regions), len(s.skus), s.pools(), s.hot, s.fullEvery)
}

// validate reports a shape the run cannot use.
func (s shape) validate() error {
	if len(s.regions) == 0 || len(s.skus) == 0 || len(s.weights) != len(s.regions) || s.hot > len(s.skus) || s.fullEvery < 1 {
		return fmt.Errorf("shape %s: %d regions, %d SKUs, %d weights, %d hot, full check every %d",
			s.name, len(s.regions), len(s.skus), len(s.weights), s.hot, s.fullEvery)
	}
	for i, w := range s.weights {
		if w.Region != s.regions[i] {
			return fmt.Errorf("shape %s: weight %d is for %s, not %s", s.name, i, w.Region, s.regions[i])
		}
	}
	if slices.ContainsFunc(s.regions, func(r string) bool { return r == storeName || r == "c1" || r == "c2" || r == transfer.Unallocated }) {
		return fmt.Errorf("shape %s: a region is named as another process", s.name)
	}
	return nil
}

// pickSKU draws a SKU for a storefront or the operator: uniformly, or with half the odds on
// the shape's hot SKUs.
func (w *world) pickSKU() string {
	skus := w.shape.skus
	if w.shape.hot > 0 && w.chance(0.5) {
		skus = skus[:w.shape.hot]
	}
	return pick(w, skus)
}
