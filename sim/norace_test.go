//go:build !race

package sim

// raceEnabled: built without -race (race_test.go).
const raceEnabled = false
