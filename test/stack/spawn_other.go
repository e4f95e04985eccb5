//go:build !linux

package stack

import "syscall"

// sysProcAttr: without Linux's Pdeathsig a child outlives a test process that
// dies without running its cleanups. The stack is only supported on Linux.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
