package bench

import "syscall"

// childAttrs makes the kernel kill a child process (redis-server) if the bench dies without
// closing it, so a crashed or killed run leaves no server behind.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
