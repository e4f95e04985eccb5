package main

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
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

// releaser gives back to the system the memory a burst of work left free:
// a cold start or a restart decodes the whole fleet's state, and the Go
// runtime returns the heap that is no longer needed only gradually (at
// 10,000 Services x 10, 70 MiB was still held, unused, minutes after the
// start). Once the fleet is bootstrapped and no transaction has been sent
// for quiet, it runs one collection that returns all free memory
// (debug.FreeOSMemory), if at least minFree is held: once per burst, since
// a new release needs a transaction first, and at most once per every.
type releaser struct {
	clock   clock.WithTicker
	quiet   time.Duration
	minFree uint64
	ready   func() bool   // the fleet is bootstrapped
	free    func() uint64 // heap held free and not returned, in bytes
	release func()        // debug.FreeOSMemory

	every time.Duration // at most one release this often

	last     atomic.Int64 // unix nanos of the last transaction (or of the bootstrap)
	due      atomic.Bool  // a burst happened since the last release
	wasReady bool         // run's goroutine only, as released
	released time.Time
}

const (
	releaseQuiet   = 10 * time.Second
	releaseEvery   = 5 * time.Minute
	releaseMinFree = 32 << 20
)

func newReleaser(ready func() bool) *releaser {
	r := &releaser{clock: clock.RealClock{}, quiet: releaseQuiet, every: releaseEvery, minFree: releaseMinFree, ready: ready,
		free: heapFree, release: debug.FreeOSMemory}
	r.due.Store(true) // the start is a burst (the bootstrap read)
	return r
}

// active records a transaction.
func (r *releaser) active() {
	r.last.Store(r.clock.Now().UnixNano())
	r.due.Store(true)
}

// run checks every quiet/2 until ctx is done.
func (r *releaser) run(ctx context.Context) {
	t := r.clock.NewTicker(r.quiet / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			r.check()
		}
	}
}

func (r *releaser) check() {
	if !r.due.Load() || !r.ready() {
		return
	}
	if !r.wasReady {
		// The workers' first looks follow the bootstrap (and adopt the
		// strings of what it read): quiet counts from here too.
		r.wasReady = true
		r.last.Store(r.clock.Now().UnixNano())
		return
	}
	if r.clock.Since(time.Unix(0, r.last.Load())) < r.quiet {
		return
	}
	if !r.released.IsZero() && r.clock.Since(r.released) < r.every {
		return // a trickle of changes does not buy a full collection each
	}
	r.due.Store(false)
	if r.clock.Since(time.Unix(0, r.last.Load())) < r.quiet {
		r.due.Store(true) // a transaction came in between: not quiet yet
		return
	}
	if r.free() >= r.minFree {
		r.release()
		r.released = r.clock.Now()
	}
}

// heapFree is the heap Go holds free and has not returned to the system.
func heapFree() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
