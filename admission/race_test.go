//go:build race

package admission

// raceEnabled: built with -race, whose sync.Pool drops items at random, so the allocation
// tests of pooled paths count without -race only.
const raceEnabled = true
