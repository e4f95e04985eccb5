package stack

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// ownerFile marks a temp dir made by this package with the pid and start time
// of the process that made it. When that process died without cleaning up
// (SIGKILL, go test -timeout) its servers are gone (Pdeathsig) but the dirs
// stay; the next process that makes one sweeps them (SweepStaleDirs).
const ownerFile = ".fleetsync-stack-owner"

// tempPrefix starts the name of every temp dir this package makes.
const tempPrefix = "fleetsync-"

var sweepOnce sync.Once

// makeTempDir makes a temp dir owned by this process, sweeping the stale
// dirs of dead processes first (once per process).
func makeTempDir(kind string) (string, error) {
	sweepOnce.Do(func() { _ = SweepStaleDirs() })
	dir, err := os.MkdirTemp("", tempPrefix+kind+"-")
	if err != nil {
		return "", err
	}
	start, err := procStartTime(os.Getpid())
	if err != nil {
		start = "?"
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(fmt.Sprintf("%d %s\n", os.Getpid(), start)), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// SweepStaleDirs removes the temp dirs this package made for processes that
// are gone (a test binary killed before its cleanups ran). Dirs without the
// owner mark, or whose owner still runs, are left alone. StartKube,
// StartConsul and StartProcess call it once per process.
func SweepStaleDirs() error {
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	if err != nil {
		return err
	}
	var firstErr error
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or being made right now
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil || f[1] == "?" {
			continue
		}
		if start, err := procStartTime(pid); err == nil && start == f[1] {
			continue // the owner still runs
		}
		if err := os.RemoveAll(dir); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// procStartTime is a process's start time in clock ticks since boot (field
// 22 of /proc/<pid>/stat): with the pid it names a process across pid reuse.
func procStartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	return f[19], nil
}
