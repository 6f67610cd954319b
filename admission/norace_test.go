//go:build !race

package admission

// raceEnabled: built without -race (race_test.go).
const raceEnabled = false
