// Package gcconf sets the Go garbage collector of a server process.
//
// A region leader keeps every live hold in memory (docs/architecture.md, "The region leader's memory") and allocates a little for
// every request. With Go's default (GOGC=100) the collector runs each time the heap doubles,
// and every run marks all of the leader's holds again: measured on the 2-core project
// machine, a quarter of the region process's CPU went to marking, much of it on cores that
// PostgreSQL needed (docs/benchmarks.md). A larger GOGC makes the runs rarer; a memory limit
// keeps the larger target from growing the heap past what the machine gives the process:
// near the limit the collector runs as often as it must, whatever GOGC says.
package gcconf

import (
	"fmt"
	"math"
	"runtime/debug"
	"runtime/metrics"
)

// Defaults of the servers (`quotad`) and of `quotactl bench`, which runs a region in its own
// process. A leader with 1,000,000 live holds has ≈ 640 MiB of heap
// (BenchmarkLeaderMemory), which fits under the default limit with room to allocate.
const (
	DefaultPercent     = 400
	DefaultMemoryLimit = 900 << 20
)

// Config is the collector's setting for the whole process.
type Config struct {
	// Percent is GOGC: how far the heap grows past what the last collection kept, in percent,
	// before the next one starts. -1 turns that trigger off (only the memory limit remains).
	Percent int
	// MemoryLimit is the soft limit on the Go runtime's memory, in bytes (GOMEMLIMIT); 0
	// means none.
	MemoryLimit int64
}

// Default is the servers' setting.
func Default() Config { return Config{Percent: DefaultPercent, MemoryLimit: DefaultMemoryLimit} }

// Validate names the bad field.
func (c Config) Validate() error {
	if c.Percent < -1 || c.Percent == 0 {
		return fmt.Errorf("gc-percent %d: must be positive, or -1 to collect only at the memory limit", c.Percent)
	}
	if c.MemoryLimit < 0 {
		return fmt.Errorf("memory-limit %d: must not be negative (0: no limit)", c.MemoryLimit)
	}
	if c.Percent == -1 && c.MemoryLimit == 0 {
		return fmt.Errorf("gc-percent -1 needs a memory-limit: without either the heap would grow without bound")
	}
	return nil
}

// Apply sets the collector for the whole process and returns the setting it replaced, so a
// test can restore it.
func Apply(c Config) Config {
	limit := c.MemoryLimit
	if limit == 0 {
		limit = math.MaxInt64
	}
	prevLimit := debug.SetMemoryLimit(limit)
	if prevLimit == math.MaxInt64 {
		prevLimit = 0
	}
	return Config{Percent: debug.SetGCPercent(c.Percent), MemoryLimit: prevLimit}
}

// Current reads the process's setting without changing it.
func Current() Config {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	c := Config{Percent: -1} // off reads as the largest uint64
	if p := s[0].Value.Uint64(); p <= math.MaxInt32 {
		c.Percent = int(p)
	}
	if limit := s[1].Value.Uint64(); limit < math.MaxInt64 {
		c.MemoryLimit = int64(limit)
	}
	return c
}

// String is the setting as the output of a command shows it.
func (c Config) String() string {
	limit := "no memory limit"
	if c.MemoryLimit > 0 {
		limit = fmt.Sprintf("memory limit %d MiB", c.MemoryLimit>>20)
	}
	if c.Percent == -1 {
		return "GOGC off, " + limit
	}
	return fmt.Sprintf("GOGC %d, %s", c.Percent, limit)
}
