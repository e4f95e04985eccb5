//go:build linux

package stack

import "syscall"

// sysProcAttr puts the child in its own process group and has the kernel
// SIGKILL it when the forking thread (see spawner) dies, i.e. when the test
// process dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
