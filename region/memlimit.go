package region

import (
	"runtime"
	"runtime/metrics"

	"github.com/quotaworks/quota/internal/gcconf"
)

// warnNearMemoryLimit logs when the live heap right after a takeover comes near the process's Go
// memory limit (quotad --memory-limit): past the limit the collector would run almost all the
// time. The load does not end with a collection (load.go), so the live heap the last one
// measured may be from before the state grew. The heap's objects, uncollected garbage
// included, bound the live heap from above: only when they come near the limit does this
// collect, to measure the live heap itself, so a state far below the limit costs nothing;
// Lead runs it on the sweeper's goroutine, after the leader serves.
func warnNearMemoryLimit(cfg *Config, holds int) {
	limit := gcconf.Current().MemoryLimit
	if limit == 0 {
		return
	}
	if _, near := heapNear("/memory/classes/heap/objects:bytes", limit); !near {
		return
	}
	runtime.GC()
	if live, near := heapNear("/gc/heap/live:bytes", limit); near {
		cfg.Logger.Warn("region state is near the process's memory limit: raise quotad --memory-limit",
			"region", cfg.Name, "live_heap_mib", live>>20, "memory_limit_mib", limit>>20, "holds", holds)
	}
}

// heapNear reads a runtime/metrics byte count and tells whether it passes
// memoryLimitWarnShare of limit.
func heapNear(metric string, limit int64) (uint64, bool) {
	s := []metrics.Sample{{Name: metric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	v := s[0].Value.Uint64()
	return v, float64(v) > memoryLimitWarnShare*float64(limit)
}

// memoryLimitWarnShare is the share of the memory limit a loaded state may take before the
// leader warns: the rest is room for the batches' garbage between collections.
const memoryLimitWarnShare = 0.7
