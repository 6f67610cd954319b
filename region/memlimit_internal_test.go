package region

import (
	"bytes"
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"
)

// A leader whose loaded state takes most of the process's memory limit says so, naming the
// flag to raise; under a roomy limit, or none, it says nothing.
func TestLoadWarnsNearTheMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	var out bytes.Buffer
	r := &Region{cfg: Config{Name: "us", Logger: slog.New(slog.NewTextHandler(&out, nil))}}

	debug.SetMemoryLimit(1 << 20) // far below any test binary's live heap
	r.warnNearMemoryLimit(42)
	if got := out.String(); !strings.Contains(got, "--memory-limit") || !strings.Contains(got, "holds=42") {
		t.Fatalf("no warning under a 1 MiB limit; logged %q", got)
	}
	out.Reset()
	debug.SetMemoryLimit(1 << 40)
	r.warnNearMemoryLimit(42)
	debug.SetMemoryLimit(prev)
	r.warnNearMemoryLimit(42)
	if out.Len() != 0 {
		t.Fatalf("warned under a roomy limit or none: %q", out.String())
	}
}
