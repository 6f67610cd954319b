//go:build race

package sim

// raceEnabled: built with -race. The race detector slows a seed six times over while each
// seed runs on one goroutine, so a -race run checks the runner itself (seeds on every core)
// with fewer seeds: raceSeeds, and the first national seed.
const raceEnabled = true
