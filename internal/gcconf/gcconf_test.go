package gcconf

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string // "" means valid
	}{
		{Default(), ""},
		{Config{Percent: 100}, ""},
		{Config{Percent: -1, MemoryLimit: 1 << 30}, ""},
		{Config{Percent: 0}, "gc-percent 0"},
		{Config{Percent: -2}, "gc-percent -2"},
		{Config{Percent: 100, MemoryLimit: -1}, "memory-limit -1"},
		{Config{Percent: -1}, "needs a memory-limit"},
	} {
		err := tc.c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: Validate() = %v, want %q", tc.c, err, tc.want)
		}
	}
}

func TestApplySetsAndReturnsThePrevious(t *testing.T) {
	orig := Apply(Config{Percent: 250, MemoryLimit: 123 << 20})
	defer Apply(orig)
	if got := debug.SetGCPercent(250); got != 250 {
		t.Errorf("GOGC = %d, want 250", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 123<<20 {
		t.Errorf("memory limit = %d, want %d", got, 123<<20)
	}
	if got := Current(); got != (Config{Percent: 250, MemoryLimit: 123 << 20}) {
		t.Errorf("Current() = %+v after Apply", got)
	}
	Apply(Config{Percent: -1, MemoryLimit: 1 << 30})
	if got := Current(); got != (Config{Percent: -1, MemoryLimit: 1 << 30}) {
		t.Errorf("Current() = %+v with the collector off", got)
	}
	Apply(Config{Percent: 250, MemoryLimit: 123 << 20})
	prev := Apply(Config{Percent: 100})
	if prev != (Config{Percent: 250, MemoryLimit: 123 << 20}) {
		t.Errorf("Apply returned %+v, want the previous setting", prev)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("memory limit = %d, want none", got)
	}
}

func TestString(t *testing.T) {
	if got := Default().String(); got != "GOGC 400, memory limit 900 MiB" {
		t.Errorf("Default().String() = %q", got)
	}
	if got := (Config{Percent: -1, MemoryLimit: 1 << 30}).String(); got != "GOGC off, memory limit 1024 MiB" {
		t.Errorf("String() = %q", got)
	}
}
