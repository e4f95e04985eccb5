package main

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
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
//
// Until the fleet is bootstrapped the GC target is bootGCPercent instead:
// the bootstrap builds the whole live heap at once (the informers' lists,
// the owned-state read, one worker per Service), and every collection
// during it marks all that is built so far, on the cores that Consul and
// the API server answer the start on. The live heap only grows until the
// gate, so the higher target raises the peak by less than it would in
// steady state; the soft limit still holds. The measurements behind both
// targets, and the commands that repeat them:
// docs/design/decisions/gc-tuning.md.
const (
	defaultGCPercent  = 50
	bootGCPercent     = 150
	memoryLimitShare  = 0.9
	unlimitedMemLimit = 1 << 60
)

// memoryTuning is what tuneMemory decided: -1 / 0 mean "left to Go".
type memoryTuning struct {
	GCPercent int
	Limit     int64
	// BootGCPercent is the GC target until the fleet is bootstrapped
	// (then GCPercent); -1 with GCPercent.
	BootGCPercent int
}

// planMemory decides the tuning from the environment and the container's
// memory limit (cgroupLimit returns ok=false when there is none).
func planMemory(getenv func(string) string, cgroupLimit func() (int64, bool)) memoryTuning {
	t := memoryTuning{GCPercent: -1, BootGCPercent: -1}
	if getenv("GOGC") == "" {
		t.GCPercent, t.BootGCPercent = defaultGCPercent, bootGCPercent
	}
	if getenv("GOMEMLIMIT") == "" {
		if max, ok := cgroupLimit(); ok {
			t.Limit = int64(float64(max) * memoryLimitShare)
		}
	}
	return t
}

// apply sets the decided values in the Go runtime, with the GC target of
// the bootstrap (releaser.booted sets GCPercent after it).
func (t memoryTuning) apply() {
	if t.BootGCPercent >= 0 {
		debug.SetGCPercent(t.BootGCPercent)
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

// releaser gives back to the system the memory a burst of work left free,
// and holds less while the fleet is quiet.
//
// Release: a cold start or a restart decodes the whole fleet's state, and the Go
// runtime returns the heap that is no longer needed only gradually (at
// 10,000 Services x 10, 70 MiB was still held, unused, minutes after the
// start). Once the fleet is bootstrapped and no transaction has been sent
// for quiet, it runs one collection that returns all free memory
// (debug.FreeOSMemory), if at least minFree is held: once per burst, since
// a new release needs a transaction first, and at most once per every.
//
// Quiet GC target: once no transaction has been sent for quiet and the
// heap grows by less than quietAllocRate, the GC target drops from gcBusy
// (the daemon's 50 %) to quietGCPercent; a transaction, or allocation
// at twice that rate, puts it back. The heap held above the live one then
// shrinks from half of it to a tenth (at 10,000 Services x 10 the live
// heap is ~190 MiB), and collecting more often costs little because
// little is allocated: a collection per 19 MiB allocated, at most one
// every 19 s there. The rate matters: in the first anti-entropy passes
// after a start (0.5 to 1.5 periods after it) every worker's pass reads
// its instances, and a 10 % target then costs several percent of a core
// more (docs/design/decisions/gc-tuning.md). Left alone when the operator
// set GOGC (gcBusy < 0).
type releaser struct {
	clock   clock.WithTicker
	quiet   time.Duration
	minFree uint64
	ready   func() bool   // the fleet is bootstrapped
	free    func() uint64 // heap held free and not returned, in bytes
	release func()        // debug.FreeOSMemory

	every time.Duration // at most one release this often

	gcBusy    int           // the GC target while writing; < 0: the operator's, never changed
	setGC     func(int)     // debug.SetGCPercent
	allocs    func() uint64 // bytes allocated on the heap since the start
	gcMu      sync.Mutex
	quietGC   atomic.Bool // the quiet GC target is set
	lastAlloc uint64      // allocs() at the last check
	lastCheck time.Time

	last     atomic.Int64 // unix nanos of the last transaction (or of the bootstrap)
	due      atomic.Bool  // a burst happened since the last release
	wasReady bool         // run's goroutine only, as released
	released time.Time
}

const (
	quietGCPercent = 10
	quietAllocRate = 1 << 20 // bytes per second
	releaseQuiet   = 10 * time.Second
	releaseEvery   = 5 * time.Minute
	releaseMinFree = 32 << 20
)

// newReleaser returns a releaser; gcBusy is the GC target the daemon set
// (memoryTuning.GCPercent: < 0 when the operator set GOGC).
func newReleaser(ready func() bool, gcBusy int) *releaser {
	r := &releaser{clock: clock.RealClock{}, quiet: releaseQuiet, every: releaseEvery, minFree: releaseMinFree, ready: ready,
		free: heapFree, release: debug.FreeOSMemory, gcBusy: gcBusy, setGC: func(p int) { debug.SetGCPercent(p) },
		allocs: heapAllocs}
	r.due.Store(true) // the start is a burst (the bootstrap read)
	return r
}

// booted sets the daemon's GC target once the fleet is bootstrapped (the
// bootstrap ran at memoryTuning.BootGCPercent).
func (r *releaser) booted() {
	if r.gcBusy < 0 {
		return
	}
	r.gcMu.Lock()
	defer r.gcMu.Unlock()
	if !r.quietGC.Load() {
		r.setGC(r.gcBusy)
	}
}

// active records a transaction.
func (r *releaser) active() {
	r.last.Store(r.clock.Now().UnixNano())
	r.due.Store(true)
	// Under gcMu, as tuneGC's look at last and its switch: either it saw
	// this transaction, or this sees its switch (a check of quietGC
	// alone could fall between the two).
	r.busyGC()
}

// busyGC puts the daemon's GC target back.
func (r *releaser) busyGC() {
	r.gcMu.Lock()
	defer r.gcMu.Unlock()
	if r.quietGC.Load() {
		r.setGC(r.gcBusy)
		r.quietGC.Store(false)
	}
}

// tuneGC sets the GC target for the last check interval: quiet when no
// transaction came for quiet and the heap grew by less than quietAllocRate.
func (r *releaser) tuneGC() {
	now, allocs := r.clock.Now(), r.allocs()
	rate := float64(quietAllocRate) // unknown: not quiet
	if !r.lastCheck.IsZero() && now.After(r.lastCheck) {
		rate = float64(allocs-r.lastAlloc) / now.Sub(r.lastCheck).Seconds()
	}
	r.lastAlloc, r.lastCheck = allocs, now
	if r.gcBusy < 0 {
		return
	}
	if rate >= 2*quietAllocRate || (rate >= quietAllocRate && !r.quietGC.Load()) {
		r.busyGC() // (back) busy above twice the rate: no switching on every check around it
		return
	}
	if r.quietGC.Load() {
		return
	}
	r.gcMu.Lock()
	defer r.gcMu.Unlock()
	if r.clock.Since(time.Unix(0, r.last.Load())) >= r.quiet {
		r.setGC(quietGCPercent)
		r.quietGC.Store(true)
		// What the busier spell left free goes back too (as after a
		// burst: at most once per every).
		r.due.Store(true)
	}
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
	if !r.ready() {
		return
	}
	if r.wasReady {
		r.tuneGC() // before a release: its collection then keeps less
	}
	if !r.due.Load() {
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

// heapAllocs is the bytes allocated on the heap since the start.
func heapAllocs() uint64 { return runtimeUint64("/gc/heap/allocs:bytes") }

// heapFree is the heap Go holds free and has not returned to the system.
func heapFree() uint64 { return runtimeUint64("/memory/classes/heap/free:bytes") }

// runtimeUint64 reads one runtime/metrics counter (0 if it is not one).
func runtimeUint64(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
