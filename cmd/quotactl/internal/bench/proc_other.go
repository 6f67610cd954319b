//go:build !linux

package bench

import "syscall"

// childAttrs is nil where the kernel cannot kill a child with its parent: Close stops it.
func childAttrs() *syscall.SysProcAttr { return nil }
