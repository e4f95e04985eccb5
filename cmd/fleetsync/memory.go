package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Memory defaults of the daemon, applied only where the operator did not
// set Go's own variables. fleetsync's live heap is steady (informer caches
// and per-worker state) and it allocates little when nothing changes, so a
// GC target of 50 % costs little CPU and keeps RSS about a quarter lower
// than Go's 100 %; a soft limit at 90 % of the container's memory limit
// makes the GC work harder before the kernel would kill the pod.
const (
	defaultGCPercent  = 50
	memoryLimitShare  = 0.9
	unlimitedMemLimit = 1 << 60
)

// memoryTuning is what tuneMemory decided: -1 / 0 mean "left to Go".
type memoryTuning struct {
	GCPercent int
	Limit     int64
}

// planMemory decides the tuning from the environment and the container's
// memory limit (cgroupLimit returns ok=false when there is none).
func planMemory(getenv func(string) string, cgroupLimit func() (int64, bool)) memoryTuning {
	t := memoryTuning{GCPercent: -1}
	if getenv("GOGC") == "" {
		t.GCPercent = defaultGCPercent
	}
	if getenv("GOMEMLIMIT") == "" {
		if max, ok := cgroupLimit(); ok {
			t.Limit = int64(float64(max) * memoryLimitShare)
		}
	}
	return t
}

// apply sets the decided values in the Go runtime.
func (t memoryTuning) apply() {
	if t.GCPercent >= 0 {
		debug.SetGCPercent(t.GCPercent)
	}
	if t.Limit > 0 {
		debug.SetMemoryLimit(t.Limit)
	}
}

// cgroupMemoryLimit reads this process's cgroup memory limit: cgroup v2's
// memory.max, else cgroup v1's memory.limit_in_bytes.
func cgroupMemoryLimit() (int64, bool) {
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		return parseMemoryLimit(string(b))
	}
	return 0, false
}

func parseMemoryLimit(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseInt(s, 10, 64)
	if s == "max" || err != nil || n <= 0 || n >= unlimitedMemLimit {
		return 0, false
	}
	return n, true
}
