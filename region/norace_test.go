//go:build !race

package region_test

// raceEnabled: built without -race (race_test.go).
const raceEnabled = false
