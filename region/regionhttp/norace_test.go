//go:build !race

package regionhttp

// raceEnabled: built without -race (race_test.go).
const raceEnabled = false
